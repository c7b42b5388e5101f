package cluster_test

import (
	"context"
	"net/netip"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stratumjoin/stratum/internal/cluster"
	"github.com/stratumjoin/stratum/internal/store"
	"github.com/stratumjoin/stratum/internal/store/boltstore"
)

// TestBudgetHoldsAcrossListeners: concurrent starts from one address
// through two Clusters sharing a store are charged at most PerAddress
// times; the /24 bounds its addresses together; a refund gives a slot
// back; a new window starts afresh.
func TestBudgetHoldsAcrossListeners(t *testing.T) {
	for name, mk := range backends(t) {
		t.Run(name, func(t *testing.T) {
			cs := mk(t)
			ctx := context.Background()
			b := cluster.Budget{PerAddress: 4, PerPrefix: 6, Window: time.Hour}
			src := netip.MustParseAddr("192.0.2.7")
			var ok atomic.Int32
			var wg sync.WaitGroup
			var charges sync.Map
			for i := range 20 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					ch, allowed, _, err := cs[i%2].ChargeStart(ctx, src, b)
					if err != nil {
						t.Error(err)
						return
					}
					if allowed {
						ok.Add(1)
						charges.Store(i, ch)
					}
				}()
			}
			wg.Wait()
			if ok.Load() != 4 {
				t.Fatalf("%d of 20 starts charged, want 4", ok.Load())
			}
			_, allowed, after, err := cs[0].ChargeStart(ctx, src, b)
			if err != nil || allowed || after <= 0 || after > time.Hour {
				t.Fatalf("over budget: allowed %v retryAfter %s err %v", allowed, after, err)
			}
			// another address of the /24 has 2 left in the prefix
			other := netip.MustParseAddr("192.0.2.99")
			for i := range 3 {
				_, allowed, _, err := cs[1].ChargeStart(ctx, other, b)
				if err != nil || allowed != (i < 2) {
					t.Fatalf("prefix start %d: allowed %v err %v", i, allowed, err)
				}
			}
			// a different /24 is not touched
			if _, allowed, _, err := cs[0].ChargeStart(ctx, netip.MustParseAddr("192.0.3.7"), b); err != nil || !allowed {
				t.Fatalf("another /24 refused: %v %v", allowed, err)
			}
			// a proven start gives its slot back
			charges.Range(func(_, v any) bool {
				if err := cs[1].Refund(ctx, v.(cluster.Charge)); err != nil {
					t.Fatal(err)
				}
				return false
			})
			if _, allowed, _, err := cs[0].ChargeStart(ctx, src, b); err != nil || !allowed {
				t.Fatalf("after a refund: allowed %v err %v", allowed, err)
			}
		})
	}
}

// TestBudgetWindowSlides: the window slides with each charge, so a sweep
// that straddles a clock boundary gets no second budget; a slot comes back
// when its charge ages out, retryAfter says when, and a refund of a charge
// that aged out adds nothing.
func TestBudgetWindowSlides(t *testing.T) {
	s := boltStore(t)
	clock := time.Date(2026, 1, 1, 10, 9, 59, 0, time.UTC)
	c := cluster.New(cluster.Config{Store: s, Now: func() time.Time { return clock }})
	ctx := context.Background()
	b := cluster.Budget{PerAddress: 2, Window: 10 * time.Minute}
	src := netip.MustParseAddr("2001:db8::1")
	charge := func(want bool) (cluster.Charge, time.Duration) {
		t.Helper()
		ch, allowed, after, err := c.ChargeStart(ctx, src, b)
		if err != nil || allowed != want {
			t.Fatalf("at %s: allowed %v, want %v (err %v)", clock.Format(time.TimeOnly), allowed, want, err)
		}
		return ch, after
	}
	first, _ := charge(true)
	clock = clock.Add(2 * time.Second) // 10:10:01, past a 10-minute boundary
	charge(true)
	if _, after := charge(false); after != 10*time.Minute-2*time.Second {
		t.Fatalf("retryAfter %s, want the first charge's age-out in 9m58s", after)
	}
	clock = clock.Add(10*time.Minute - 2*time.Second) // the first charge ages out
	if err := c.Refund(ctx, first); err != nil {
		t.Fatal(err)
	}
	charge(true)
	if _, after := charge(false); after != 2*time.Second {
		t.Fatalf("retryAfter %s, want 2s", after)
	}
	clock = clock.Add(10 * time.Minute)
	charge(true)
	charge(true)
	charge(false)
	if got := cluster.SourcePrefix(netip.MustParseAddr("2001:db8::1:2:3:4")).String(); got != "2001:db8::/64" {
		t.Fatalf("prefix %s", got)
	}
	if got := cluster.SourcePrefix(netip.MustParseAddr("::ffff:10.1.2.3")).String(); got != "10.1.2.0/24" {
		t.Fatalf("prefix %s", got)
	}
	clock = clock.Add(time.Hour)
	if err := c.SweepBudgets(ctx, b.Window); err != nil {
		t.Fatal(err)
	}
	kvs, _ := s.List(ctx, "budget/", "", 0)
	if len(kvs) != 0 {
		t.Fatalf("%d budget entries left after the sweep", len(kvs))
	}
}

func boltStore(t *testing.T) store.Store {
	t.Helper()
	s, err := boltstore.Open(filepath.Join(t.TempDir(), "state.db"), boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}
