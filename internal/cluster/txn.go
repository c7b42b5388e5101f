package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/stratumjoin/stratum/internal/store"
)

// ErrConflict is returned when a transaction loses too many rounds.
var ErrConflict = errors.New("too much contention on the store, try again")

// maxCASRounds bounds the rounds of one update; each lost round means some
// other transaction committed, so progress is guaranteed overall.
const maxCASRounds = 1000

// txn is one round of an update: every key it reads is recorded with the
// revision read, and the commit compares all of them, so a decision made
// on a value that changed since never commits.
type txn struct {
	ctx    context.Context
	st     store.Store
	reads  map[string]store.KV
	order  []string // read keys, in the order read
	ops    []store.Op
	opAt   map[string]int
	events []Event
	c      *Cluster
}

// get reads key once per round; a second read returns the first.
func (tx *txn) get(key string) (store.KV, error) {
	if kv, ok := tx.reads[key]; ok {
		return kv, nil
	}
	kv, err := tx.st.Get(tx.ctx, key)
	if err != nil {
		return store.KV{}, fmt.Errorf("read %s: %w", key, err)
	}
	tx.reads[key] = kv
	tx.order = append(tx.order, key)
	return kv, nil
}

// getJSON reads key into v; found is false for a missing key.
func (tx *txn) getJSON(key string, v any) (found bool, err error) {
	kv, err := tx.get(key)
	if err != nil || kv.Rev == 0 {
		return false, err
	}
	if err := json.Unmarshal(kv.Value, v); err != nil {
		return false, fmt.Errorf("decode %s: %w", key, err)
	}
	return true, nil
}

// getString reads key as a string; found is false for a missing key.
func (tx *txn) getString(key string) (v string, found bool, err error) {
	kv, err := tx.get(key)
	return string(kv.Value), kv.Rev != 0, err
}

// getCount reads a decimal counter; a missing key is 0, anything but a
// decimal number is an error (a counter read wrong would hand out an
// address twice or lift a limit).
func (tx *txn) getCount(key string) (uint64, error) {
	v, found, err := tx.getString(key)
	if err != nil || !found {
		return 0, err
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("counter %s holds %q, not a count: %w", key, v, err)
	}
	return n, nil
}

func (tx *txn) op(op store.Op) {
	if i, ok := tx.opAt[op.Key]; ok {
		tx.ops[i] = op
		return
	}
	tx.opAt[op.Key] = len(tx.ops)
	tx.ops = append(tx.ops, op)
}

// put writes v as JSON; a later write of the same key in the round wins.
func (tx *txn) put(key string, v any) { tx.op(putJSON(key, v)) }

func (tx *txn) putString(key, v string) { tx.op(store.Op{Key: key, Value: []byte(v)}) }

func (tx *txn) putCount(key string, n uint64) { tx.putString(key, strconv.FormatUint(n, 10)) }

func (tx *txn) del(key string) { tx.op(store.Op{Key: key, Delete: true}) }

// event records an event that commits with the round.
func (tx *txn) event(typ, actor string, fields map[string]any) {
	ev, op := tx.c.newEvent(typ, actor, fields)
	tx.events = append(tx.events, ev)
	tx.op(op)
}

func (tx *txn) cmps() []store.Cmp {
	cmps := make([]store.Cmp, 0, len(tx.order))
	for _, k := range tx.order {
		cmps = append(cmps, store.Cmp{Key: k, Rev: tx.reads[k].Rev})
	}
	return cmps
}

// update runs fn and commits what it wrote, comparing every key it read:
// if any changed, fn runs again on fresh reads. An error from fn ends the
// update with nothing written; a round that writes nothing commits
// nothing. An error from the store means the outcome is unknown.
func (c *Cluster) update(ctx context.Context, fn func(tx *txn) error) error {
	for range maxCASRounds {
		tx := &txn{ctx: ctx, st: c.store, c: c, reads: map[string]store.KV{}, opAt: map[string]int{}}
		if err := fn(tx); err != nil {
			return err
		}
		if len(tx.ops) == 0 {
			return nil
		}
		ok, err := c.store.Txn(ctx, tx.cmps(), tx.ops)
		if err != nil {
			return fmt.Errorf("commit: %w", err)
		}
		if ok {
			c.logEvents(tx.events...)
			return nil
		}
	}
	return ErrConflict
}

// getJSON reads key into v outside a transaction.
func getJSON(ctx context.Context, s store.Store, key string, v any) (found bool, err error) {
	kv, err := s.Get(ctx, key)
	if err != nil {
		return false, fmt.Errorf("read %s: %w", key, err)
	}
	if kv.Rev == 0 {
		return false, nil
	}
	if err := json.Unmarshal(kv.Value, v); err != nil {
		return false, fmt.Errorf("decode %s: %w", key, err)
	}
	return true, nil
}

func putJSON(key string, v any) store.Op {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("cluster: marshal %T: %v", v, err)) // only our own plain structs are marshalled
	}
	return store.Op{Key: key, Value: b}
}

// listJSON decodes every value under prefix, in key order.
func listJSON[T any](ctx context.Context, s store.Store, prefix, after string, limit int) ([]T, error) {
	kvs, err := s.List(ctx, prefix, after, limit)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", prefix, err)
	}
	out := make([]T, 0, len(kvs))
	for _, kv := range kvs {
		var v T
		if err := json.Unmarshal(kv.Value, &v); err != nil {
			return nil, fmt.Errorf("decode %s: %w", kv.Key, err)
		}
		out = append(out, v)
	}
	return out, nil
}

// eventSeq gives events keys that sort in time order, unique across
// listeners sharing a store.
type eventSeq struct {
	mu   sync.Mutex
	last int64
}

func (q *eventSeq) next(now time.Time) string {
	q.mu.Lock()
	n := now.UnixNano()
	if n <= q.last {
		n = q.last + 1
	}
	q.last = n
	q.mu.Unlock()
	var r [4]byte
	_, _ = rand.Read(r[:])
	return fmt.Sprintf("%020d-%s", n, hex.EncodeToString(r[:]))
}

func sortStrings(s []string) { sort.Strings(s) }

func randomID(prefix string, n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}
