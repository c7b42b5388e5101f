package listener

import (
	"context"
	"sync"
	"time"

	"github.com/quic-go/quic-go"
)

// quic-go hands a connection whose handshake completed to a goroutine
// blocked in Accept, or else to a queue of 32; with the queue full it
// closes the connection with CONNECTION_REFUSED, after both sides paid
// for the whole handshake. A single accept loop on a busy machine can go
// unscheduled while more than 32 handshakes complete (a herd of 10,000
// token joins on two cores lost 12-131 handshakes a run that way), and
// each refused agent comes back for another handshake. So every admitted
// handshake makes sure an accepter waits for it: admit starts one whenever
// fewer wait than handshakes are in progress, and a completed handshake
// always finds one blocked in Accept.
//
// An accepter serves the connection it takes and ends. One that takes
// nothing for acceptIdle while more wait than handshakes are in progress
// (theirs failed) ends too, so a storm leaves no goroutines behind.
const acceptIdle = 10 * time.Second

// acceptPool is the accepters of a listener that listens.
type acceptPool struct {
	ctx  context.Context
	ln   *quic.Listener
	idle time.Duration // acceptIdle

	mu     sync.Mutex // orders starts against close
	closed bool
	wg     sync.WaitGroup
}

// needAccepter is called with a.mu held as a handshake is admitted: when
// fewer accepters wait than handshakes are in progress it counts one more,
// and the caller starts it.
func (a *admission) needAccepter() bool {
	if a.accepters >= a.handshakes {
		return false
	}
	a.accepters++
	return true
}

// accepterLeft uncounts an accepter that took a connection or ended.
func (a *admission) accepterLeft() {
	a.mu.Lock()
	a.accepters--
	a.mu.Unlock()
}

// spareAccepter uncounts an idle accepter, and reports so, when more wait
// than handshakes are in progress.
func (a *admission) spareAccepter() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.accepters <= a.handshakes {
		return false
	}
	a.accepters--
	return true
}

// startAccepter starts the accepter admit counted.
func (l *Listener) startAccepter() {
	p := l.pool.Load()
	if p == nil {
		// not listening yet, or no longer: Run's accept loop takes it
		l.adm.accepterLeft()
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		l.adm.accepterLeft()
		return
	}
	p.wg.Go(func() { l.accept(p) })
}

func (l *Listener) accept(p *acceptPool) {
	for {
		ctx, cancel := context.WithTimeout(p.ctx, p.idle)
		conn, err := p.ln.Accept(ctx)
		idle := err != nil && ctx.Err() != nil && p.ctx.Err() == nil
		cancel()
		if idle {
			if l.adm.spareAccepter() {
				return
			}
			continue
		}
		l.adm.accepterLeft()
		if err != nil {
			// the listener is closing: Run's accept loop reports why
			return
		}
		if h := l.cfg.hooks.Accepted; h != nil {
			h()
		}
		l.serveConn(p.ctx, conn)
		return
	}
}

// close waits for the accepters and what they serve; none starts after.
func (p *acceptPool) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.wg.Wait()
}
