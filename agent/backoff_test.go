package agent_test

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/stratumjoin/stratum/agent"
	"github.com/stratumjoin/stratum/internal/joincode"
	"github.com/stratumjoin/stratum/internal/wire"
)

// A listener that stays down: agent.Run tries again after each failed
// dial, waiting Backoff(n) between tries (full jitter, here fixed at 1/2
// of the ceiling), and the waits double from BackoffBase up to BackoffMax.
// In fake time the whole sequence, minutes of waiting, takes no real time.
func TestRunBackoffSequence(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sec, err := joincode.Parse("dnjoin-" + strings.Repeat("A", 26) + "-" + strings.Repeat("A", 52))
		if err != nil {
			t.Fatal(err)
		}
		const base, max, tries = time.Second, 16 * time.Second, 8
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		var mu sync.Mutex
		var dials []time.Time
		var waits []time.Duration
		down := errors.New("connection refused")
		err = agent.Run(ctx, agent.RunConfig{
			StateDir:    filepath.Join(t.TempDir(), "state"),
			Endpoint:    "127.0.0.1:9",
			Secret:      func() (joincode.Secret, error) { return sec, nil },
			Logger:      slog.New(slog.NewTextHandler(io.Discard, nil)),
			Rand:        func() float64 { return 0.5 },
			BackoffBase: base, BackoffMax: max,
			JoinConfig: func(jc *agent.JoinConfig) {
				jc.Dial = func(context.Context, string, *tls.Config, *quic.Config) (*quic.Conn, error) {
					mu.Lock()
					defer mu.Unlock()
					dials = append(dials, time.Now())
					if len(dials) == tries {
						cancel()
					}
					return nil, down
				}
			},
			OnRetry: func(_ int, wait time.Duration, err error) {
				if !errors.Is(err, down) {
					t.Errorf("retry after %v, want the dial's error", err)
				}
				mu.Lock()
				waits = append(waits, wait)
				mu.Unlock()
			},
		})
		if err != nil {
			t.Fatalf("Run = %v, want nil once its context ends", err)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(dials) != tries {
			t.Fatalf("%d dials, want %d", len(dials), tries)
		}
		for n := 1; n < tries; n++ {
			want := agent.Backoff(n-1, base, max, 0.5)
			if got := dials[n].Sub(dials[n-1]); got != want {
				t.Errorf("wait before try %d: %s, want %s", n, got, want)
			}
			if waits[n-1] != want {
				t.Errorf("OnRetry %d told %s, want %s", n-1, waits[n-1], want)
			}
		}
		// 0.5s 1s 2s 4s 8s 8s 8s: capped at max/2 with r = 0.5
		if got := dials[tries-1].Sub(dials[0]); got != 31500*time.Millisecond {
			t.Errorf("the tries spread over %s, want 31.5s", got)
		}
	})
}

// TestRetryWaitCapsBusyRefusals: after a listener refused the connection
// for being busy, the wait stops doubling at BusyMax; any other transient
// failure keeps the service's schedule.
func TestRetryWaitCapsBusyRefusals(t *testing.T) {
	one := func() float64 { return 1 }
	busy := &agent.UnreachableError{&quic.TransportError{ErrorCode: quic.ConnectionRefused, Remote: true}}
	closedBusy := &agent.UnreachableError{&agent.ClosedError{Code: wire.CloseBusy}}
	local := &agent.UnreachableError{&quic.TransportError{ErrorCode: quic.ConnectionRefused}}
	other := &agent.UnreachableError{errors.New("timeout: no recent network activity")}
	for _, tc := range []struct {
		name string
		err  error
		n    int
		want time.Duration
	}{
		{"busy, first", busy, 0, time.Second},
		{"busy, tenth", busy, 10, agent.BusyMax},
		{"no slot, tenth", closedBusy, 10, agent.BusyMax},
		{"refused by this side, tenth", local, 10, 4 * time.Minute},
		{"timeout, tenth", other, 10, 4 * time.Minute},
		{"rate limited past the cap", &agent.RefusedError{Code: wire.CodeRateLimited, RetryAfter: 20 * time.Second}, 0, 25 * time.Second},
	} {
		if got := agent.RetryWait(tc.n, time.Second, 4*time.Minute, one, tc.err); got != tc.want {
			t.Errorf("%s: wait %s, want %s", tc.name, got, tc.want)
		}
	}
}
