// Package boltstore is the default store backend: one bbolt file on the
// listener's disk, written with fsync on every transaction.
//
// It registers the URL scheme "bolt" with package store, so a blank import
// makes store.Open accept bolt:/var/lib/stratum/state.db (or the equivalent
// bolt:///var/lib/stratum/state.db). The path must be absolute.
//
// Layout: bucket "kv" maps each key to an 8-byte big-endian revision followed
// by the value; bucket "meta" holds the global revision counter under "rev".
// Every successful Txn that writes bumps the counter once and stamps that one
// revision on every key it writes, as etcd does, so revisions from this
// backend and from etcdstore mean the same thing to callers.
//
// The file holds OPAQUE records, from which short join codes could be
// attacked offline, so it is created 0600 (its directory 0700) and Open
// refuses a file that group or others can read or write.
package boltstore

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/stratumjoin/stratum/internal/store"
)

// DefaultTimeout is how long Open waits for another process to release the
// file lock when Options.Timeout is zero.
const DefaultTimeout = time.Second

var (
	bucketKV   = []byte("kv")
	bucketMeta = []byte("meta")
	keyRev     = []byte("rev")
)

// revLen is the size of the revision stamped before every stored value.
const revLen = 8

// These roll back a bbolt write transaction that has nothing to write, so a
// failed compare-and-swap costs no page write and no fsync.
var (
	errCmpFailed = errors.New("comparison failed")
	errNoWrites  = errors.New("nothing to write")
)

func init() {
	store.Register("bolt", func(_ context.Context, u *url.URL) (store.Store, error) {
		path, err := pathFromURL(u)
		if err != nil {
			return nil, err
		}
		return Open(path, Options{ReleasePagesAfter: DefaultReleasePagesAfter, ReleasePagesEvery: DefaultReleasePagesEvery, CommitLinger: DefaultCommitLinger})
	})
}

// pathFromURL accepts bolt:/abs/path and bolt:///abs/path.
func pathFromURL(u *url.URL) (string, error) {
	if u.Host != "" {
		return "", fmt.Errorf("bolt store url: unexpected host %q, want bolt:/abs/path or bolt:///abs/path", u.Host)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return "", errors.New("bolt store url: query and fragment are not supported")
	}
	path := u.Path
	if u.Opaque != "" {
		path = u.Opaque
	}
	if !filepath.IsAbs(path) {
		return "", fmt.Errorf("bolt store url: path %q is not absolute", path)
	}
	return filepath.Clean(path), nil
}

// Options tunes Open.
type Options struct {
	// Timeout bounds the wait for the file lock that another open of the same
	// file holds; zero means DefaultTimeout. bbolt would otherwise wait forever.
	Timeout time.Duration
	// ReadOnly opens an existing file without writing it (store check).
	ReadOnly bool
	// ReleasePagesAfter, when positive, hands the pages read through the
	// file's mapping back (ReleasePages) this long after a write: a burst
	// of writes then keeps only what it touched lately mapped. The store
	// URL's opener sets DefaultReleasePagesAfter.
	ReleasePagesAfter time.Duration
	// ReleasePagesEvery, when positive, also hands them back after every
	// that many reads and transactions while writes come concurrently (the
	// last commit was shared), in the call that completes the count: under
	// such a load the timer's goroutine, or the commit that would wake it,
	// can be tens of milliseconds late, while reads go on mapping pages.
	// One writer at a time leaves the releases to the timer: each release
	// makes the next reads fault the pages they need in again, and how
	// often a read finds its page released would otherwise follow which
	// pages the calls around it touch: a difference in the Challenge's
	// timing between kinds of locator, which it must not show
	// (BenchmarkChallengeTiming, docs/store.md). The store URL's opener
	// sets DefaultReleasePagesEvery.
	ReleasePagesEvery int
	// CommitLinger, when positive, is how long a commit may wait for more
	// writers to share it while writes come concurrently (group.go). The
	// store URL's opener sets DefaultCommitLinger.
	CommitLinger time.Duration
}

// DefaultCommitLinger is the listener's CommitLinger: a herd's joins
// commit some 370 times a second, so a commit that waits 2 ms is shared
// by about two; a join's latency under a herd is seconds.
const DefaultCommitLinger = 2 * time.Millisecond

// DefaultReleasePagesAfter is the listener's ReleasePagesAfter. Each
// page a read faults in maps the cached pages around it too (the kernel's
// fault-around, 64 KiB, which bbolt's MADV_RANDOM does not turn off), so a
// herd's joins map some ten 64 KiB runs each: released every second, the
// mapping of a 66 MB store held 52 MiB during a 10,000-token herd, every
// 250 ms 40 MiB. Minting 10,000 tokens left 40 MiB mapped with no join to
// release them. A release of 60 MiB of resident pages takes about 3 ms
// and mapping a page again 0.3 us, so ten a second cost under 1 % of a CPU.
const DefaultReleasePagesAfter = 100 * time.Millisecond

// DefaultReleasePagesEvery is the listener's ReleasePagesEvery. A join
// makes about six reads and transactions, and under a herd they take some
// five page faults in the store's mapping, each mapping 64 KiB. In single
// 10,000-token herds (two rounds, interleaved), the store's pages at the
// listener's peak were 33 MiB with the timer alone, 14-21 MiB with a
// release every 32 calls and 9-11 MiB every 8, with no change in the
// listener's CPU per join. But sequential token joins in bursts of 50 cost
// 2 % more at 8 (3.13 against 3.07 ms, medians of 5 interleaved runs of
// 200), and nothing measurable at 32 (3.27 against 3.35 ms); both before
// the count was limited to shared commits (Options.ReleasePagesEvery), as
// a herd's are, which leaves sequential joins to the timer.
const DefaultReleasePagesEvery = 32

// Store is a store.Store on one bbolt file.
type Store struct {
	db     *bolt.DB
	path   string
	broken atomic.Pointer[error]
	// watch tells in-process watchers of committed writes: every writer of
	// the file is in this process, since bbolt locks it.
	watch store.Notifier
	group groupCommit
	// written wakes releasePagesAfterWrites after a commit; stopRelease
	// ends it, and released is closed when it has ended.
	written     chan struct{}
	stopRelease chan struct{}
	stopOnce    sync.Once
	released    chan struct{}
	// touches counts reads and transactions toward the next release
	// (ReleasePagesEvery), which is made only while group.company says
	// the last commit was shared.
	touches      atomic.Int64
	releaseEvery int64
}

var (
	_ store.Store   = (*Store)(nil)
	_ store.Watcher = (*Store)(nil)
)

// Watch implements store.Watcher with in-process notification.
func (s *Store) Watch(ctx context.Context, key string) (<-chan struct{}, error) {
	return s.watch.Watch(ctx, key)
}

// Open opens or creates the bbolt file at path, creating its parent
// directory 0700 when missing.
func Open(path string, opts Options) (*Store, error) {
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("create store directory: %w", err)
	}
	if fi, err := os.Stat(path); err == nil {
		if perm := fi.Mode().Perm(); perm&0o077 != 0 {
			return nil, fmt.Errorf("store file %s has mode %#o, want 0600: fix it with chmod 600", path, perm)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("stat store file: %w", err)
	}
	if err := checkFile(path); err != nil {
		return nil, err
	}
	if opts.ReadOnly {
		if _, err := os.Stat(path); err != nil {
			return nil, fmt.Errorf("store file: %w", err)
		}
	}
	s := &Store{path: path}
	s.group.linger = opts.CommitLinger
	err := s.guard(func() error {
		var err error
		s.db, err = bolt.Open(path, 0o600, &bolt.Options{Timeout: opts.Timeout, ReadOnly: opts.ReadOnly})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("open store file %s: %w", path, err)
	}
	if err := s.consistent(); err != nil {
		_ = s.db.Close()
		return nil, err
	}
	if opts.ReadOnly {
		return s, nil
	}
	err = s.update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketKV, bucketMeta} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		_ = s.db.Close()
		return nil, fmt.Errorf("initialise store file %s: %w", path, store.NameSpace(err))
	}
	s.releaseEvery = int64(opts.ReleasePagesEvery)
	if opts.ReleasePagesAfter > 0 {
		s.written, s.stopRelease, s.released = make(chan struct{}, 1), make(chan struct{}), make(chan struct{})
		go s.releasePagesAfterWrites(opts.ReleasePagesAfter)
	}
	return s, nil
}

// releasePagesAfterWrites hands the mapped pages back after each burst of
// writes, at most once every after.
func (s *Store) releasePagesAfterWrites(after time.Duration) {
	defer close(s.released)
	for {
		select {
		case <-s.stopRelease:
			return
		case <-s.written:
		}
		t := time.NewTimer(after)
		select {
		case <-s.stopRelease:
			t.Stop()
			return
		case <-t.C:
		}
		_ = s.ReleasePages() // fails only on a closed file, or a damaged one the next read reports
	}
}

// touched counts a read or a transaction, and hands the mapped pages back
// on every releaseEvery-th while commits are shared.
func (s *Store) touched() {
	if s.releaseEvery > 0 && s.touches.Add(1)%s.releaseEvery == 0 && s.group.company.Load() {
		_ = s.ReleasePages() // fails only on a closed file, or a damaged one the next read reports
	}
}

// wrote tells releasePagesAfterWrites of a commit.
func (s *Store) wrote() {
	if s.written == nil {
		return
	}
	select {
	case s.written <- struct{}{}:
	default: // a release is due already
	}
}

// Close releases the file and its lock.
func (s *Store) Close() error {
	if s.stopRelease != nil {
		s.stopOnce.Do(func() { close(s.stopRelease) })
		<-s.released
	}
	s.watch.CloseAll()
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("close store file: %w", err)
	}
	return nil
}

// decode copies a stored record out of bbolt's memory map, which is only
// valid until the transaction ends.
func decode(key string, raw []byte) (store.KV, error) {
	if len(raw) < revLen {
		return store.KV{}, fmt.Errorf("store record %q is corrupt: %d bytes", key, len(raw))
	}
	return store.KV{
		Key:   key,
		Value: bytes.Clone(raw[revLen:]),
		Rev:   int64(binary.BigEndian.Uint64(raw[:revLen])),
	}, nil
}

// revOf returns the modification revision stored for key, 0 when absent.
func revOf(b *bolt.Bucket, key string) (int64, error) {
	raw := b.Get([]byte(key))
	if raw == nil {
		return 0, nil
	}
	if len(raw) < revLen {
		return 0, fmt.Errorf("store record %q is corrupt: %d bytes", key, len(raw))
	}
	return int64(binary.BigEndian.Uint64(raw[:revLen])), nil
}

// Get implements store.Store.
func (s *Store) Get(ctx context.Context, key string) (store.KV, error) {
	if err := ctx.Err(); err != nil {
		return store.KV{}, err
	}
	kv := store.KV{Key: key}
	err := s.view(func(tx *bolt.Tx) error {
		raw := tx.Bucket(bucketKV).Get([]byte(key))
		if raw == nil {
			return nil
		}
		var err error
		kv, err = decode(key, raw)
		return err
	})
	s.touched()
	if err != nil {
		return store.KV{}, fmt.Errorf("get %q: %w", key, err)
	}
	return kv, nil
}

// List implements store.Store.
func (s *Store) List(ctx context.Context, prefix, after string, limit int) ([]store.KV, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	start := []byte(prefix)
	if after >= prefix {
		// The smallest key strictly after `after`.
		start = append([]byte(after), 0)
	}
	var out []store.KV
	err := s.view(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketKV).Cursor()
		for k, v := c.Seek(start); k != nil && bytes.HasPrefix(k, []byte(prefix)); k, v = c.Next() {
			if limit > 0 && len(out) == limit {
				break
			}
			kv, err := decode(string(k), v)
			if err != nil {
				return err
			}
			out = append(out, kv)
		}
		return nil
	})
	s.touched()
	if err != nil {
		return nil, fmt.Errorf("list %q: %w", prefix, err)
	}
	return out, nil
}

// Txn implements store.Store: the comparisons and the writes happen in one
// bbolt write transaction, which bbolt serialises and fsyncs on commit.
// Transactions that arrive while another commits share the next commit
// (group.go), one after another within it, as if committed alone.
func (s *Store) Txn(ctx context.Context, cmps []store.Cmp, ops []store.Op) (bool, error) {
	if err := store.CheckTxn(cmps, ops); err != nil {
		return false, err
	}
	if err := ctx.Err(); err != nil {
		return false, err
	}
	err := s.write(func(tx *bolt.Tx) error {
		kv := tx.Bucket(bucketKV)
		for _, c := range cmps {
			rev, err := revOf(kv, c.Key)
			if err != nil {
				return err
			}
			if rev != c.Rev {
				return errCmpFailed
			}
		}
		if len(ops) == 0 {
			// Nothing to write: roll back rather than commit an empty
			// transaction, and leave the revision alone as etcd does.
			return errNoWrites
		}
		meta := tx.Bucket(bucketMeta)
		var rev uint64
		if raw := meta.Get(keyRev); raw != nil {
			if len(raw) != revLen {
				return fmt.Errorf("store revision counter is corrupt: %d bytes", len(raw))
			}
			rev = binary.BigEndian.Uint64(raw)
		}
		rev++
		stamp := binary.BigEndian.AppendUint64(nil, rev)
		if err := meta.Put(keyRev, stamp); err != nil {
			return err
		}
		for _, op := range ops {
			var err error
			if op.Delete {
				err = kv.Delete([]byte(op.Key))
			} else {
				// A fresh buffer: bbolt keeps the slice until commit, and
				// the caller may reuse op.Value as soon as Txn returns.
				rec := make([]byte, 0, revLen+len(op.Value))
				rec = append(append(rec, stamp...), op.Value...)
				err = kv.Put([]byte(op.Key), rec)
			}
			if err != nil {
				return fmt.Errorf("write %q: %w", op.Key, err)
			}
		}
		return nil
	}, store.Waited(ctx))
	s.touched()
	switch {
	case err == nil:
		s.watch.Notify(ops)
		s.wrote()
		return true, nil
	case errors.Is(err, errNoWrites):
		return true, nil
	case errors.Is(err, errCmpFailed):
		return false, nil
	default:
		return false, fmt.Errorf("store txn: %w", store.NameSpace(err))
	}
}
