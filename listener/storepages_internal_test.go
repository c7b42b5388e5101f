package listener

import (
	"testing"
	"time"

	"github.com/stratumjoin/stratum/internal/store"
)

// pageStore is a store that counts the times its pages are released.
type pageStore struct {
	store.Store
	released int
}

func (s *pageStore) ReleasePages() error { s.released++; return nil }

// TestBurstReturnReleasesStorePages: when a burst's memory is returned,
// the store's mapped pages go back too, through the deadline wrapper the
// listener puts around every store (boltstore's TestReleasePagesKeepsEveryValue
// shows what ReleasePages itself does).
func TestBurstReturnReleasesStorePages(t *testing.T) {
	s := &pageStore{}
	l := &Listener{store: store.WithDeadline(s, time.Minute)}
	l.burstReturned()
	if s.released != 1 {
		t.Fatalf("a burst's return released the store's pages %d times, want 1", s.released)
	}
}
