package agent

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/stratumjoin/stratum/internal/wire"
)

// FailoverDelay is how long the agent waits for one listener's QUIC
// handshake before it also dials the next endpoint. A listener that
// refuses at once (an ICMP error) is passed over sooner. Only the QUIC
// handshake has happened by then, so an endpoint that is down costs the
// code no attempt.
const FailoverDelay = 1500 * time.Millisecond

// DefaultDialTimeout is how long the agent waits for a listener's QUIC
// handshake. A busy listener holds new connections in its backlog, first
// come first served, for up to 25 s before it lets them in (a fleet of
// 10,000 machines booting at once needs about 30 s of two cores): an agent
// that gave up sooner would come back as a new connection at the back of
// the queue. A listener that is down is passed over after FailoverDelay
// when there are others.
const DefaultDialTimeout = 30 * time.Second

// SplitEndpoints reads a list of endpoints separated by commas or spaces,
// as STRATUM_ENDPOINT holds them.
func SplitEndpoints(s string) []string {
	return strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' || r == '\n' })
}

// endpointList is first then rest, without repeats or empty names.
func endpointList(first string, rest []string) []string {
	var out []string
	for _, ep := range append([]string{first}, rest...) {
		if ep != "" && !slices.Contains(out, ep) {
			out = append(out, ep)
		}
	}
	return out
}

type dialResult struct {
	conn *quic.Conn
	ep   string
	err  error
}

// dialFirst dials endpoints in order, starting the next when the one
// before has failed or has not answered within delay, and returns the
// first connection whose handshake completes; the others are closed. It
// fails only when every endpoint failed.
func dialFirst(ctx context.Context, endpoints []string, delay time.Duration, dial func(ctx context.Context, endpoint string) (*quic.Conn, error)) (*quic.Conn, string, error) {
	if len(endpoints) == 0 {
		return nil, "", errors.New("no endpoint to dial")
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	results := make(chan dialResult, len(endpoints))
	next, pending := 0, 0
	start := func() {
		ep := endpoints[next]
		next++
		pending++
		go func() {
			c, err := dial(ctx, ep)
			results <- dialResult{c, ep, err}
		}()
	}
	start()
	timer := time.NewTimer(delay)
	defer timer.Stop()
	var errs []error
	for pending > 0 {
		select {
		case r := <-results:
			pending--
			if r.err == nil {
				cancel()
				// late winners are closed as they arrive
				go func(n int) {
					for range n {
						if l := <-results; l.err == nil {
							l.conn.CloseWithError(quic.ApplicationErrorCode(wire.CloseDone), "")
						}
					}
				}(pending)
				return r.conn, r.ep, nil
			}
			errs = append(errs, fmt.Errorf("%s: %w", r.ep, r.err))
			if next < len(endpoints) {
				start()
				timer.Reset(delay)
			}
		case <-timer.C:
			if next < len(endpoints) {
				start()
				timer.Reset(delay)
			}
		}
	}
	return nil, "", errors.Join(errs...)
}
