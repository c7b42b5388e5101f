package listener

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stratumjoin/stratum/internal/procmem"
	"github.com/stratumjoin/stratum/internal/store"
	"github.com/stratumjoin/stratum/internal/store/boltstore"
)

// TestBurstReturnReleasesStorePages: when a burst's memory is returned,
// the store file's pages its joins read go back too, through the
// deadline wrapper the listener puts around every store.
func TestBurstReturnReleasesStorePages(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	bs, err := boltstore.Open(path, boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer bs.Close()
	l := &Listener{store: store.WithDeadline(bs, time.Minute), logger: slog.New(slog.DiscardHandler)}
	ctx := context.Background()
	for batch := range 20 {
		var ops []store.Op
		for i := range 100 {
			ops = append(ops, store.Op{Key: fmt.Sprintf("node/%02d-%03d", batch, i), Value: make([]byte, 600)})
		}
		if _, err := l.store.Txn(ctx, nil, ops); err != nil {
			t.Fatal(err)
		}
	}
	if kvs, err := l.store.List(ctx, "node/", "", 0); err != nil || len(kvs) != 2000 {
		t.Fatalf("listed %d values: %v", len(kvs), err)
	}
	mapped := func() int {
		t.Helper()
		kib, err := procmem.MappedKiB(os.Getpid(), path)
		if err != nil {
			t.Fatal(err)
		}
		return kib
	}
	before := mapped()
	l.burstReturned()
	if after := mapped(); before < 512 || after > before/10 {
		t.Fatalf("store pages resident: %d KiB before the return, %d KiB after", before, after)
	}
}
