package store_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/stratumjoin/stratum/internal/store"
	"github.com/stratumjoin/stratum/internal/store/boltstore"
)

// TestDeadlineKeepsWatcher: the deadline wrapper hides none of the
// backend's optional interfaces (a wrapper that did once broke backups),
// and unwraps to the backend.
func TestDeadlineKeepsWatcher(t *testing.T) {
	b, err := boltstore.Open(filepath.Join(t.TempDir(), "state.db"), boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	s := store.WithDeadline(b, time.Second)
	w, ok := s.(store.Watcher)
	if !ok {
		t.Fatal("the wrapped bbolt store is no longer a Watcher")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := w.Watch(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Txn(ctx, nil, []store.Op{{Key: "k", Value: []byte("v")}}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatal("no notification through the wrapper")
	}
	if store.Unwrap(s) != store.Store(b) {
		t.Fatal("Unwrap does not reach the backend")
	}
}
