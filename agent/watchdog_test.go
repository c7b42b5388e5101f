package agent_test

import (
	"context"
	"crypto/tls"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/stratumjoin/stratum/agent"
	"github.com/stratumjoin/stratum/internal/joincode"
)

// TestWatchdogPingsFromTheServiceLoop: the service loop pings while it
// backs off after a failed join and while a join it started is in flight,
// on one schedule (never more than the interval apart, however the waits
// fall), and stops when the loop does. Fake time (synctest) runs ten
// minutes at once.
func TestWatchdogPingsFromTheServiceLoop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sec, err := joincode.NewCode("4F")
		if err != nil {
			t.Fatal(err)
		}
		const interval = 30 * time.Second
		var mu sync.Mutex
		var pings []time.Time
		var dials atomic.Int64
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		start := time.Now()
		cfg := agent.RunConfig{
			StateDir: t.TempDir(), Endpoint: "listener.invalid:9444",
			Secret: func() (joincode.Secret, error) { return sec, nil },
			// each failed join waits 17s; each join hangs 20s before it
			// fails: waits that do not line up with the interval
			Rand:        func() float64 { return 0.5 },
			BackoffBase: 34 * time.Second, BackoffMax: 34 * time.Second,
			WatchdogInterval: interval,
			Watchdog: func() {
				mu.Lock()
				pings = append(pings, time.Now())
				mu.Unlock()
			},
			JoinConfig: func(jc *agent.JoinConfig) {
				jc.DialTimeout = time.Hour
				jc.Dial = func(ctx context.Context, _ string, _ *tls.Config, _ *quic.Config) (*quic.Conn, error) {
					dials.Add(1)
					select {
					case <-time.After(20 * time.Second):
					case <-ctx.Done():
					}
					return nil, errors.New("unreachable")
				}
			},
		}
		go func() { done <- agent.Run(ctx, cfg) }()

		time.Sleep(10*time.Minute + time.Second) // fake time (synctest): ten minutes of the loop
		synctest.Wait()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		mu.Lock()
		got := append([]time.Time(nil), pings...)
		mu.Unlock()
		if n := dials.Load(); n < 10 {
			t.Fatalf("%d joins tried in 10 minutes, want at least 10", n)
		}
		// one ping at once, then one every 30s: 21 in 10 minutes
		if len(got) != 21 {
			t.Errorf("%d pings in 10m at a 30s interval, want 21", len(got))
		}
		prev := start
		for i, p := range got {
			if gap := p.Sub(prev); gap > interval {
				t.Errorf("ping %d came %s after the one before, more than the %s interval", i, gap, interval)
			}
			prev = p
		}
		// Run has returned: nothing pings any more
		time.Sleep(5 * time.Minute) // fake time (synctest): every goroutine has ended, so nothing can ping
		mu.Lock()
		defer mu.Unlock()
		if len(pings) != len(got) {
			t.Errorf("%d pings after Run returned", len(pings)-len(got))
		}
	})
}
