package store

import (
	"context"
	"sync"
)

// Watcher is implemented by backends that can tell their callers when a key
// changes, so that a change made by one listener (a CA rotation) takes
// effect on every listener at once instead of at its next poll. It is
// optional: callers test for it with a type assertion.
type Watcher interface {
	// Watch returns a channel that receives a value soon after each
	// committed change of key (changes may be coalesced into one value).
	// The channel is closed when ctx ends or the watch breaks (an etcd
	// member lost, the store closed); the caller then reads key again, since
	// a change may have been missed, and watches anew.
	Watch(ctx context.Context, key string) (<-chan struct{}, error)
}

// Notifier is the in-process watch of a backend whose every writer is in
// this process (bbolt): the backend calls Notify after each committed
// transaction with the keys it wrote.
type Notifier struct {
	mu   sync.Mutex
	subs map[string]map[chan struct{}]struct{}
}

// Watch implements Watcher.
func (n *Notifier) Watch(ctx context.Context, key string) (<-chan struct{}, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ch := make(chan struct{}, 1)
	n.mu.Lock()
	if n.subs == nil {
		n.subs = map[string]map[chan struct{}]struct{}{}
	}
	if n.subs[key] == nil {
		n.subs[key] = map[chan struct{}]struct{}{}
	}
	n.subs[key][ch] = struct{}{}
	n.mu.Unlock()
	context.AfterFunc(ctx, func() {
		n.mu.Lock()
		defer n.mu.Unlock()
		if _, ok := n.subs[key][ch]; ok {
			delete(n.subs[key], ch)
			close(ch)
		}
		// every pending join watches a key of its own: an ended watch
		// must not leave its key behind
		if len(n.subs[key]) == 0 {
			delete(n.subs, key)
		}
	})
	return ch, nil
}

// Notify wakes the watchers of every key that ops wrote.
func (n *Notifier) Notify(ops []Op) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, op := range ops {
		for ch := range n.subs[op.Key] {
			select {
			case ch <- struct{}{}:
			default: // one wake-up is pending already
			}
		}
	}
}

// CloseAll ends every watch, as a backend's Close does.
func (n *Notifier) CloseAll() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, m := range n.subs {
		for ch := range m {
			close(ch)
		}
	}
	n.subs = nil
}
