package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stratumjoin/stratum/internal/cluster"
	"github.com/stratumjoin/stratum/internal/joincode"
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
					ch, allowed, _, err := chargeStart(ctx, cs[i%2], src, b)
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
			_, allowed, after, err := chargeStart(ctx, cs[0], src, b)
			if err != nil || allowed || after <= 0 || after > time.Hour {
				t.Fatalf("over budget: allowed %v retryAfter %s err %v", allowed, after, err)
			}
			// another address of the /24 has 2 left in the prefix
			other := netip.MustParseAddr("192.0.2.99")
			for i := range 3 {
				_, allowed, _, err := chargeStart(ctx, cs[1], other, b)
				if err != nil || allowed != (i < 2) {
					t.Fatalf("prefix start %d: allowed %v err %v", i, allowed, err)
				}
			}
			// a different /24 is not touched
			if _, allowed, _, err := chargeStart(ctx, cs[0], netip.MustParseAddr("192.0.3.7"), b); err != nil || !allowed {
				t.Fatalf("another /24 refused: %v %v", allowed, err)
			}
			// a proven start gives its slot back
			charges.Range(func(_, v any) bool {
				if err := cs[1].Refund(ctx, v.(cluster.Charge)); err != nil {
					t.Fatal(err)
				}
				return false
			})
			if _, allowed, _, err := chargeStart(ctx, cs[0], src, b); err != nil || !allowed {
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
		ch, allowed, after, err := chargeStart(ctx, c, src, b)
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

// chargeStart starts an attempt from src on a selector no code has,
// charged to b as a listener charges a code's start, and reports the
// charge, whether the source was within its budget, and when a slot frees
// if not.
func chargeStart(ctx context.Context, c *cluster.Cluster, src netip.Addr, b cluster.Budget) (cluster.Charge, bool, time.Duration, error) {
	att, err := c.Begin(ctx, cluster.BeginRequest{Locator: "ZZ", Budget: &cluster.StartBudget{Source: src, Budget: b}})
	return att.Charge, err == nil && !att.OverBudget, att.RetryAfter, err
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

// recordingStore wraps a real store, counting the transactions that
// commit writes and recording the keys read.
type recordingStore struct {
	store.Store
	mu     sync.Mutex
	writes int
	reads  []string
}

func (s *recordingStore) Get(ctx context.Context, key string) (store.KV, error) {
	s.mu.Lock()
	s.reads = append(s.reads, key)
	s.mu.Unlock()
	return s.Store.Get(ctx, key)
}

func (s *recordingStore) Txn(ctx context.Context, cmps []store.Cmp, ops []store.Op) (bool, error) {
	ok, err := s.Store.Txn(ctx, cmps, ops)
	if ok && err == nil && len(ops) > 0 {
		s.mu.Lock()
		s.writes++
		s.mu.Unlock()
	}
	return ok, err
}

// took returns what was written and read since the last call.
func (s *recordingStore) took() (writes int, reads []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	writes, reads = s.writes, s.reads
	s.writes, s.reads = 0, nil
	return writes, reads
}

// TestBeginChargesTheBudgetInItsCount: a code's start that names its
// source is charged in the transaction that counts it (one write), and
// so is an unknown locator's; once the source is over budget, a start
// is answered OverBudget with nothing written and neither locator read;
// a start refused as busy is not charged; and a token's start is never
// charged.
func TestBeginChargesTheBudgetInItsCount(t *testing.T) {
	rs := &recordingStore{Store: boltStore(t)}
	c := cluster.New(cluster.Config{Store: rs})
	ctx := context.Background()
	code := mintKind(t, c, "jc-budget", cluster.KindCode, 0)
	r, _ := joincode.RandomLowerBase32(20)
	token := mintKind(t, c, "jt_"+r, cluster.KindToken, 0)
	src := netip.MustParseAddr("192.0.2.7")
	budget := &cluster.StartBudget{Source: src, Budget: cluster.Budget{PerAddress: 2, Window: time.Hour}}
	rs.took()

	att, err := c.Begin(ctx, cluster.BeginRequest{Locator: code.Locator, Budget: budget})
	if err != nil || !att.Counted || att.OverBudget || !att.Charge.Charged() {
		t.Fatalf("first start: %+v, %v; want counted and charged", att, err)
	}
	if w, _ := rs.took(); w != 1 {
		t.Fatalf("a charged count made %d writes, want 1", w)
	}
	att, err = c.Begin(ctx, cluster.BeginRequest{Locator: "ZZ", Budget: budget})
	if err != nil || att.OverBudget || !att.Charge.Charged() {
		t.Fatalf("unknown locator's start: %+v, %v; want charged", att, err)
	}
	if w, _ := rs.took(); w != 1 {
		t.Fatalf("an unknown locator's charged start made %d writes, want 1", w)
	}
	att, err = c.Begin(ctx, cluster.BeginRequest{Locator: code.Locator, Budget: budget})
	if err != nil || !att.OverBudget || att.RetryAfter <= 0 || att.Counted || att.Charge.Charged() || att.Secret != nil {
		t.Fatalf("start over budget: %+v, %v; want OverBudget with a wait, uncounted", att, err)
	}
	w, reads := rs.took()
	if w != 0 {
		t.Fatalf("a start over budget made %d writes", w)
	}
	for _, k := range reads {
		if !strings.HasPrefix(k, "budget/") {
			t.Fatalf("a start over budget read %q; want only its budget read", k)
		}
	}
	if n, _ := unproven(t, c, code.ID); n != 1 {
		t.Fatalf("unproven %d after a start over budget, want 1", n)
	}

	// a busy code: ten starts in flight from elsewhere, then one from a
	// fresh source is refused as busy and keeps its whole budget
	busy := mintKind(t, c, "jc-busy", cluster.KindCode, 0)
	for i := range cluster.MaxUnproven {
		if _, err := c.Begin(ctx, cluster.BeginRequest{Locator: busy.Locator, Guess: fmt.Sprint("g", i)}); err != nil {
			t.Fatal(err)
		}
	}
	fresh := &cluster.StartBudget{Source: netip.MustParseAddr("198.51.100.1"), Budget: cluster.Budget{PerAddress: 1, Window: time.Hour}}
	att, err = c.Begin(ctx, cluster.BeginRequest{Locator: busy.Locator, Guess: "another", Budget: fresh})
	if !errors.Is(err, cluster.ErrBusy) || att.Charge.Charged() {
		t.Fatalf("start on a busy code: %+v, %v; want ErrBusy, uncharged", att, err)
	}
	if att, err := c.Begin(ctx, cluster.BeginRequest{Locator: code.Locator, Budget: fresh}); err != nil || att.OverBudget {
		t.Fatalf("the busy start's source after it: %+v, %v; want its one start left", att, err)
	}

	// a token's start is not charged: nothing is written before its KE2
	rs.took()
	for range 3 {
		att, err := c.Begin(ctx, cluster.BeginRequest{Locator: token.Locator, Budget: budget})
		if err != nil || att.OverBudget || att.Charge.Charged() || !att.Deferred {
			t.Fatalf("token start: %+v, %v; want deferred and uncharged", att, err)
		}
	}
	if w, _ := rs.took(); w != 0 {
		t.Fatalf("token starts made %d writes, want none", w)
	}
}
