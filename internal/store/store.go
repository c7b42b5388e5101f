// Package store is the durable state of a Stratum Join listener: a small
// key-value interface whose only write is an atomic compare-and-swap
// transaction on per-key modification revisions, so the same join logic is
// correct on one bbolt file and on an etcd cluster shared by several listeners.
//
// Backends register themselves by URL scheme (bolt:/var/lib/stratum/state.db,
// etcd://10.0.0.1:2379,10.0.0.2:2379) and are opened with Open. Every backend
// passes the one conformance suite in package storetest.
package store

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sort"
	"sync"
)

// KV is one stored key. Rev is the revision of the transaction that last
// wrote it; it is never 0 for a key that exists. Revisions are global to the
// store, as in etcd: each Txn that writes gets one revision, greater than
// every revision before it, and stamps it on every key it writes.
type KV struct {
	Key   string
	Value []byte
	Rev   int64
}

// Cmp holds when Key's current modification revision equals Rev. Rev 0
// means "the key does not exist", so {Key: k} guards a create-if-absent.
type Cmp struct {
	Key string
	Rev int64
}

// Op writes Value to Key, or deletes Key when Delete is set.
type Op struct {
	Key    string
	Value  []byte
	Delete bool
}

// Store is implemented by each backend. Values returned are copies the
// caller owns, and a Txn does not keep the caller's Op.Value slices.
//
// Give every call a deadline: the etcd backend waits for its cluster for as
// long as the context allows.
type Store interface {
	// Get returns the key; a missing key is KV{Key: key} with Rev 0 and no error.
	Get(ctx context.Context, key string) (KV, error)
	// List returns up to limit keys (limit <= 0: all) that start with
	// prefix and sort strictly after the key `after` ("" = from the start),
	// in ascending key order.
	List(ctx context.Context, prefix, after string, limit int) ([]KV, error)
	// Txn applies every op atomically and durably if every cmp holds, and
	// reports whether it did; with no ops it only evaluates the cmps. An
	// error means the outcome is unknown: callers count it as an attempt
	// spent. Both backends refuse, with an error and no effect, an empty
	// key, a key written twice in one Txn, and more than 128 cmps or 128
	// ops (etcd's default --max-txn-ops).
	Txn(ctx context.Context, cmps []Cmp, ops []Op) (bool, error)
	// Close releases the backend. Calls after Close return errors; a second
	// Close returns nil.
	Close() error
}

// ErrUnknownScheme is returned by Open for a URL no backend registered.
var ErrUnknownScheme = errors.New("unknown store scheme")

// Opener opens a backend from its parsed URL.
type Opener func(ctx context.Context, u *url.URL) (Store, error)

var (
	mu      sync.Mutex
	openers = map[string]Opener{}
)

// Register makes a backend available to Open under scheme. It panics on a
// duplicate, as database/sql does.
func Register(scheme string, open Opener) {
	mu.Lock()
	defer mu.Unlock()
	if _, dup := openers[scheme]; dup {
		panic("store: backend registered twice: " + scheme)
	}
	openers[scheme] = open
}

// Schemes lists the registered backends.
func Schemes() []string {
	mu.Lock()
	defer mu.Unlock()
	var s []string
	for k := range openers {
		s = append(s, k)
	}
	sort.Strings(s)
	return s
}

// Open opens the store that rawURL names.
func Open(ctx context.Context, rawURL string) (Store, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		// url.Error quotes the whole input, which may hold credentials;
		// keep only the reason.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, fmt.Errorf("parse store url: %w", err)
	}
	mu.Lock()
	open, ok := openers[u.Scheme]
	mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("%w %q (have %v)", ErrUnknownScheme, u.Scheme, Schemes())
	}
	return open(ctx, u)
}

// MaxTxnOps is etcd's default --max-txn-ops: at most this many
// comparisons and this many operations in one transaction, on every
// backend, so a transaction that works on bbolt cannot fail on etcd.
const MaxTxnOps = 128

// CheckTxn refuses, before anything is written, what etcd would refuse:
// too many comparisons or operations, an empty key, or one key written
// twice. Every backend calls it.
func CheckTxn(cmps []Cmp, ops []Op) error {
	if len(cmps) > MaxTxnOps || len(ops) > MaxTxnOps {
		return fmt.Errorf("store txn: %d comparisons and %d operations, at most %d of each", len(cmps), len(ops), MaxTxnOps)
	}
	for _, c := range cmps {
		if c.Key == "" {
			return errors.New("store txn: empty key in comparison")
		}
	}
	seen := make(map[string]bool, len(ops))
	for _, op := range ops {
		if op.Key == "" {
			return errors.New("store txn: empty key in operation")
		}
		if seen[op.Key] {
			return fmt.Errorf("store txn: key %q written twice", op.Key)
		}
		seen[op.Key] = true
	}
	return nil
}

// Dumper is implemented by backends that can read everything they hold
// as of one revision, page by page, for a backup taken while serving.
type Dumper interface {
	Dump(ctx context.Context, page func([]KV) error) error
}

// Unwrap returns the backend under wrappers such as Deadline.
func Unwrap(s Store) Store {
	for {
		u, ok := s.(interface{ Unwrap() Store })
		if !ok {
			return s
		}
		s = u.Unwrap()
	}
}
