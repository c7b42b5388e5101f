package agent_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/stratumjoin/stratum/agent"
	"github.com/stratumjoin/stratum/internal/joincode"
	"github.com/stratumjoin/stratum/internal/wire"
	"github.com/stratumjoin/stratum/listener"
	"github.com/stratumjoin/stratum/listener/adminapi"
	"github.com/stratumjoin/stratum/listener/listenertest"
)

// TestRunBacksOffWhenRateLimited: a join told JOIN_RATE_LIMITED waits at
// least the RetryAfter the listener named (at most 30s) before it tries
// again, and joins once the source's budget window has ended.
func TestRunBacksOffWhenRateLimited(t *testing.T) {
	clock := newFakeClock()
	l := listenertest.Start(t, listenertest.Options{
		Init:   listener.InitConfig{Now: clock.Now()},
		Config: listener.Config{Now: clock.Now, UnprovenPerSource: 1, BudgetWait: 10 * time.Millisecond},
	})
	sec, _ := mintCode(t, l, adminapi.MintCodeRequest{AutoApprove: true})
	wrong, err := joincode.NewCode(sec.Locator)
	if err != nil {
		t.Fatal(err)
	}
	// one guess spends this address's budget
	if _, err := agent.Join(context.Background(), agent.JoinConfig{StateDir: filepath.Join(t.TempDir(), "g"), Endpoint: l.Endpoint, Secret: wrong, Now: clock.Now}); !errors.Is(err, agent.ErrNotAccepted) {
		t.Fatalf("guess: %v", err)
	}
	type retry struct {
		wait time.Duration
		err  error
	}
	retried := make(chan retry, 16)
	a := startAgent(t, l.Endpoint, sec, filepath.Join(t.TempDir(), "state"), clock, func(c *agent.RunConfig) {
		c.BackoffBase, c.BackoffMax = time.Second, time.Second
		c.OnRetry = func(_ int, wait time.Duration, err error) { retried <- retry{wait, err} }
	})
	var r retry
	select {
	case r = <-retried:
	case <-time.After(30 * time.Second):
		t.Fatal("no retry")
	}
	var refused *agent.RefusedError
	if !errors.As(r.err, &refused) || refused.Code != wire.CodeRateLimited || refused.RetryAfter <= 0 || refused.RetryAfter > 30*time.Second || r.wait < refused.RetryAfter {
		t.Fatalf("retry after %s for %v, want at least the listener's RetryAfter", r.wait, r.err)
	}
	// past the end of the budget's window (10m): the wait fires and the
	// source's budget is whole again
	clock.waitWaiters(t, 1)
	clock.Advance(10 * time.Minute)
	a.waitReady(t, 30*time.Second)
}
