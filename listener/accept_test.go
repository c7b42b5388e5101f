package listener_test

import (
	"context"
	"crypto/tls"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/stratumjoin/stratum/internal/wire"
	"github.com/stratumjoin/stratum/listener"
	"github.com/stratumjoin/stratum/listener/listenertest"
)

// TestEveryCompletedHandshakeIsTaken: 64 handshakes complete while
// whatever took the first connections from quic-go is held up, as a busy
// machine's scheduler holds up an accept loop. Every one is taken and
// served: none is refused after its handshake because quic-go's accept
// queue (32) was full.
func TestEveryCompletedHandshakeIsTaken(t *testing.T) {
	const n = 64
	gate := make(chan struct{})
	var taken atomic.Int32
	l := listenertest.Start(t, listenertest.Options{Config: listener.WithHooks(listener.Config{PerSourceConnections: -1},
		listener.Hooks{Accepted: func() { taken.Add(1); <-gate }})})
	var once sync.Once
	release := func() { once.Do(func() { close(gate) }) }
	t.Cleanup(release)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conns := make(chan *quic.Conn, n)
	refused := make(chan int, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			conn, err := dialJoin(ctx, l.Endpoint)
			if err != nil {
				if ctx.Err() == nil {
					t.Errorf("dial %d: %v", i, err)
				}
				return
			}
			defer conn.CloseWithError(quic.ApplicationErrorCode(wire.CloseDone), "")
			conns <- conn
			<-conn.Context().Done()
			var te *quic.TransportError
			if errors.As(context.Cause(conn.Context()), &te) && te.Remote && te.ErrorCode == quic.ConnectionRefused {
				refused <- i
			}
		})
	}
	fatal := func(format string, args ...any) {
		t.Helper()
		cancel()
		release()
		for {
			select {
			case c := <-conns:
				c.CloseWithError(0, "")
				continue
			default:
			}
			break
		}
		wg.Wait()
		t.Fatalf(format, args...)
	}
	for taken.Load() < n {
		select {
		case i := <-refused:
			fatal("connection %d refused after its handshake with %d taken", i, taken.Load())
		case <-ctx.Done():
			fatal("%d of %d completed handshakes taken", taken.Load(), n)
		case <-time.After(10 * time.Millisecond):
		}
	}
	release()
	for range n {
		(<-conns).CloseWithError(quic.ApplicationErrorCode(wire.CloseDone), "")
	}
	wg.Wait()
	select {
	case i := <-refused:
		t.Fatalf("connection %d refused after its handshake", i)
	default:
	}
}

// TestSpareAcceptersEnd: handshakes that fail leave the accepters started
// for them waiting with nothing to take; once idle they end, so a storm
// of failed handshakes leaves no goroutines behind.
func TestSpareAcceptersEnd(t *testing.T) {
	l := listenertest.Start(t, listenertest.Options{Config: listener.WithHooks(listener.Config{PerSourceConnections: -1},
		listener.Hooks{AcceptIdle: 50 * time.Millisecond})})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			// no protocol the listener speaks: the handshake fails
			_, err := quic.DialAddr(ctx, l.Endpoint, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"nothing"}}, &quic.Config{})
			if err == nil {
				t.Error("a handshake with an unknown protocol completed")
			}
		})
	}
	wg.Wait()
	for {
		s := l.ConnStats()
		if s.Handshakes == 0 && s.Accepters == 0 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%d accepters still wait with %d handshakes in progress", s.Accepters, s.Handshakes)
		case <-time.After(10 * time.Millisecond):
		}
	}
	// and a new handshake still finds one
	conn, err := dialJoin(ctx, l.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	conn.CloseWithError(0, "")
}
