package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"time"
)

var (
	// ErrUnavailable means the store did not answer within its deadline
	// (an etcd cluster partitioned away or out of quorum, a disk that
	// hangs). It is transient: the caller says so and tries again later.
	ErrUnavailable = errors.New("the store did not answer in time")
	// ErrNoSpace means the store refused a write for want of space: a
	// full disk under a bbolt file (ENOSPC), or etcd's space quota
	// (NOSPACE alarm). It is transient once space is made.
	ErrNoSpace = errors.New("the store is out of disk space")
	// ErrCorrupt means the store file failed a consistency check or a
	// transaction hit a damaged page.
	ErrCorrupt = errors.New("the store is damaged")
)

// Transient reports whether err is a store failure that passes without
// any change of the request: a timeout or a full disk.
func Transient(err error) bool {
	return errors.Is(err, ErrUnavailable) || errors.Is(err, ErrNoSpace)
}

// Deadline is a Store whose every call ends within Timeout, and whose
// errors are named: ErrUnavailable for a call that ran out of its time,
// ErrNoSpace for a full disk. Other optional interfaces of the backend are
// reached through Unwrap.
type Deadline struct {
	Store
	Timeout time.Duration
}

// WithDeadline wraps s so that every call ends within d (d <= 0: s as is).
// A backend that watches (Watcher) stays one: the wrapper hides none of
// its optional interfaces. A watch has no deadline; it lasts as long as
// its context.
func WithDeadline(s Store, d time.Duration) Store {
	if d <= 0 {
		return s
	}
	dl := &Deadline{Store: s, Timeout: d}
	if w, ok := s.(Watcher); ok {
		return &deadlineWatcher{Deadline: dl, w: w}
	}
	return dl
}

type deadlineWatcher struct {
	*Deadline
	w Watcher
}

func (d *deadlineWatcher) Watch(ctx context.Context, key string) (<-chan struct{}, error) {
	ch, err := d.w.Watch(ctx, key)
	return ch, NameSpace(err)
}

// Unwrap returns the backend.
func (d *Deadline) Unwrap() Store { return d.Store }

func (d *Deadline) name(ctx, callCtx context.Context, op string, err error) error {
	if err == nil {
		return nil
	}
	if ctx.Err() == nil && callCtx.Err() != nil {
		return fmt.Errorf("%s: %w (no answer within %s): %w", op, ErrUnavailable, d.Timeout, err)
	}
	return NameSpace(err)
}

// NameSpace marks an out-of-space error from either backend as ErrNoSpace.
func NameSpace(err error) error {
	if err == nil || errors.Is(err, ErrNoSpace) {
		return err
	}
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) || strings.Contains(err.Error(), "database space exceeded") || strings.Contains(err.Error(), "no space left on device") {
		return fmt.Errorf("%w: %w", ErrNoSpace, err)
	}
	return err
}

// Get reads within the deadline.
func (d *Deadline) Get(ctx context.Context, key string) (KV, error) {
	cctx, cancel := context.WithTimeout(ctx, d.Timeout)
	defer cancel()
	kv, err := d.Store.Get(cctx, key)
	return kv, d.name(ctx, cctx, "read", err)
}

// List lists within the deadline.
func (d *Deadline) List(ctx context.Context, prefix, after string, limit int) ([]KV, error) {
	cctx, cancel := context.WithTimeout(ctx, d.Timeout)
	defer cancel()
	kvs, err := d.Store.List(cctx, prefix, after, limit)
	return kvs, d.name(ctx, cctx, "list", err)
}

// Txn commits within the deadline; past it the outcome is unknown, as for
// any Txn error.
func (d *Deadline) Txn(ctx context.Context, cmps []Cmp, ops []Op) (bool, error) {
	cctx, cancel := context.WithTimeout(ctx, d.Timeout)
	defer cancel()
	ok, err := d.Store.Txn(cctx, cmps, ops)
	return ok, d.name(ctx, cctx, "write", err)
}
