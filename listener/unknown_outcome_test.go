package listener_test

import (
	"context"
	"errors"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stratumjoin/stratum/internal/store"
	"github.com/stratumjoin/stratum/internal/store/boltstore"
	"github.com/stratumjoin/stratum/internal/wire"
	"github.com/stratumjoin/stratum/listener"
	"github.com/stratumjoin/stratum/listener/adminapi"
	"github.com/stratumjoin/stratum/listener/listenertest"
)

// lostAnswers wraps a real store: while armed, each transaction commits
// and then reports an error, as a timed-out write to etcd does.
type lostAnswers struct {
	store.Store
	armed atomic.Bool
}

func (s *lostAnswers) Txn(ctx context.Context, cmps []store.Cmp, ops []store.Op) (bool, error) {
	ok, err := s.Store.Txn(ctx, cmps, ops)
	if err == nil && s.armed.Load() {
		return ok, errors.New("context deadline exceeded (the write may have happened)")
	}
	return ok, err
}

// TestUnknownWriteOutcomeSpendsTheAttempt: when the store cannot say
// whether the count was written, the listener answers nothing, and the
// attempt stays spent.
func TestUnknownWriteOutcomeSpendsTheAttempt(t *testing.T) {
	bolt, err := boltstore.Open(filepath.Join(t.TempDir(), "state.db"), boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bolt.Close() })
	s := &lostAnswers{Store: bolt}
	l := listenertest.Start(t, listenertest.Options{Config: listener.Config{Store: s, UnprovenPerSource: -1}})
	sec, code := mint(t, l, adminapi.MintCodeRequest{AutoApprove: true})

	s.armed.Store(true)
	out, err := rawJoin{Secret: sec, StopAfterChallenge: true}.run(context.Background(), l.Endpoint)
	s.armed.Store(false)
	if err == nil && len(out.Challenge.KE2) != 0 {
		t.Fatalf("the listener answered a Challenge (%d bytes) though it could not confirm the count", out.ChallengeSize)
	}
	// what it answers instead is the retryable JOIN_UNAVAILABLE
	if len(out.Results) != 1 || out.Results[0].Code != wire.CodeUnavailable || out.Results[0].RetryAfter < 1 {
		t.Fatalf("answer to a count of unknown outcome: %+v, %v; want JOIN_UNAVAILABLE", out.Results, err)
	}
	c, _ := l.Admin.Code(context.Background(), code.ID)
	if c.FailedAttempts != 1 {
		t.Fatalf("failedAttempts %d after a count of unknown outcome, want 1", c.FailedAttempts)
	}
}

// countedWrites wraps a real store and counts the transactions that write.
type countedWrites struct {
	store.Store
	writes atomic.Int32
}

func (s *countedWrites) Txn(ctx context.Context, cmps []store.Cmp, ops []store.Op) (bool, error) {
	ok, err := s.Store.Txn(ctx, cmps, ops)
	if len(ops) > 0 && ok && err == nil {
		s.writes.Add(1)
	}
	return ok, err
}

// TestProvenJoinGivesItsChargeBackInProve: with the default budget of
// unproven starts, a proven join commits twice (the charge with the
// count, the join with the charge given back), and its source's budget
// is whole again after more joins than it holds.
func TestProvenJoinGivesItsChargeBackInProve(t *testing.T) {
	bolt, err := boltstore.Open(filepath.Join(t.TempDir(), "state.db"), boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bolt.Close() })
	s := &countedWrites{Store: bolt}
	l := listenertest.Start(t, listenertest.Options{Init: listener.InitConfig{Store: s}, Config: listener.Config{Store: s, UnprovenPerSource: 2, BudgetWait: time.Millisecond}})
	sec, _ := mint(t, l, adminapi.MintCodeRequest{AutoApprove: true, MaxUses: uses(0)})
	for i := range 5 {
		before := s.writes.Load()
		if _, _, err := join(t, l, sec, wire.Facts{}); err != nil {
			t.Fatalf("join %d with a budget of 2: %v", i, err)
		}
		if n := s.writes.Load() - before; n != 2 {
			t.Fatalf("join %d made %d committed writes, want 2 (charge and count, join and refund)", i, n)
		}
	}
}
