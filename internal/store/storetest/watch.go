package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/stratumjoin/stratum/internal/store"
)

// testWatch checks a backend's optional store.Watcher: a committed write of
// the key wakes the watch (also one made through another path to the same
// data: the caller's Txn), and the channel closes when the context ends.
// A backend without a watch passes trivially; both of ours have one.
func testWatch(t *testing.T, ctx context.Context, s store.Store) {
	w, ok := s.(store.Watcher)
	if !ok {
		t.Logf("%T has no watch", s)
		return
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch, err := w.Watch(wctx, "watched")
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	for i := range 3 {
		mustTxn(t, ctx, s, nil, []store.Op{put("watched", string(rune('a'+i)))})
		select {
		case _, open := <-ch:
			if !open {
				t.Fatal("watch closed while its context lives")
			}
		case <-ctx.Done():
			t.Fatalf("write %d of the watched key woke no watcher", i)
		}
	}
	// A delete is a change too.
	mustTxn(t, ctx, s, nil, []store.Op{{Key: "watched", Delete: true}})
	select {
	case <-ch:
	case <-ctx.Done():
		t.Fatal("deleting the watched key woke no watcher")
	}
	cancel()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case _, open := <-ch:
			if !open {
				return
			}
		case <-deadline:
			t.Fatal("watch channel not closed after its context ended")
		}
	}
}
