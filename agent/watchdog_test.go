package agent_test

import (
	"context"
	"crypto/tls"
	"errors"
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
// and stops when the loop does. Fake time (synctest) runs ten minutes of
// backoff at once.
func TestWatchdogPingsFromTheServiceLoop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sec, err := joincode.NewCode("4F")
		if err != nil {
			t.Fatal(err)
		}
		var pings, dials atomic.Int64
		hang := make(chan struct{})
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		cfg := agent.RunConfig{
			StateDir: t.TempDir(), Endpoint: "listener.invalid:9444",
			Secret:           func() (joincode.Secret, error) { return sec, nil },
			Rand:             func() float64 { return 1 },
			BackoffBase:      10 * time.Minute,
			BackoffMax:       10 * time.Minute,
			WatchdogInterval: 30 * time.Second,
			Watchdog:         func() { pings.Add(1) },
			JoinConfig: func(jc *agent.JoinConfig) {
				jc.DialTimeout = time.Hour
				jc.Dial = func(ctx context.Context, _ string, _ *tls.Config, _ *quic.Config) (*quic.Conn, error) {
					if dials.Add(1) == 1 {
						return nil, errors.New("unreachable")
					}
					// the second join hangs until the test ends it
					select {
					case <-hang:
					case <-ctx.Done():
					}
					return nil, errors.New("gave up")
				}
			},
		}
		go func() { done <- agent.Run(ctx, cfg) }()

		// the first dial fails at once: 10 minutes of backoff follow
		time.Sleep(10*time.Minute - time.Second)
		synctest.Wait()
		if got := pings.Load(); got != 19 {
			t.Errorf("pings during 10m of backoff at a 30s interval: %d, want 19", got)
		}
		time.Sleep(2 * time.Second) // the second join starts and hangs
		synctest.Wait()
		if dials.Load() != 2 {
			t.Fatalf("dials: %d, want 2", dials.Load())
		}
		before := pings.Load()
		time.Sleep(5 * time.Minute)
		synctest.Wait()
		if got := pings.Load() - before; got != 10 {
			t.Errorf("pings during 5m of a hanging join: %d, want 10", got)
		}
		cancel()
		close(hang)
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		after := pings.Load()
		time.Sleep(5 * time.Minute)
		if pings.Load() != after {
			t.Errorf("pings after Run returned: %d more", pings.Load()-after)
		}
	})
}
