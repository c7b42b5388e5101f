package listener

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"os"
	"sync"
	"time"

	"golang.org/x/net/ipv4"
)

// Past its bounds (connections at work, handshakes in progress) the
// listener lets no new connection start: the first datagrams of new
// connections wait in its backlog (backlog.go) and are handed to quic-go,
// first come first served, as room frees. A full backlog drops them
// unanswered, as a kernel drops the SYNs of a full accept queue: the
// agent's QUIC stack sends them again on its probe timer. Refusing them
// (CONNECTION_REFUSED) would cost the listener little, but each refused
// agent would come back as a new connection: a new TLS key share, and for
// `stratum-agent join` a new process; a herd of 10,000 token joins on two
// cores fell into refusal storms that way (1,800-15,000 refusals, p99
// 47-61 s against 31-36 s in the runs without one).

// gatedConn is the listener's UDP socket with the gate in its reads. It
// keeps every method of *net.UDPConn, so quic-go still reads in batches
// and sends with GSO: quic-go reads through a connection's own ReadBatch
// when it has one.
type gatedConn struct {
	*net.UDPConn
	batch *ipv4.PacketConn
	// pass decides a datagram read from the socket: true hands it to
	// quic-go; false means the gate kept it (in the backlog) or dropped it.
	pass func(d heldDatagram) bool

	mu    sync.Mutex
	ready []heldDatagram // let in from the backlog, for the next read
	// readDeadline is the deadline quic-go set; woken means a wake-up's
	// deadline (in the past) stands in for it until a read consumes it.
	readDeadline time.Time
	woken        bool
	// reading, when set, is called as a read goes to the socket (tests).
	reading func()
}

func newGatedConn(c *net.UDPConn, pass func(heldDatagram) bool) *gatedConn {
	return &gatedConn{UDPConn: c, batch: ipv4.NewPacketConn(c), pass: pass}
}

// letIn hands datagrams from the backlog to quic-go: the next read returns
// them, and a read blocked on the socket now is woken for them.
func (c *gatedConn) letIn(ds []heldDatagram) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ready = append(c.ready, ds...)
	if !c.woken {
		c.woken = true
		_ = c.UDPConn.SetReadDeadline(time.Unix(1, 0))
	}
}

// SetReadDeadline keeps quic-go's deadline apart from a wake-up's: it is
// the one in force again once the read that the wake-up ended returns.
func (c *gatedConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.readDeadline = t
	if c.woken {
		return nil
	}
	return c.UDPConn.SetReadDeadline(t)
}

// SetDeadline is SetReadDeadline and the socket's write deadline.
func (c *gatedConn) SetDeadline(t time.Time) error {
	if err := c.UDPConn.SetWriteDeadline(t); err != nil {
		return err
	}
	return c.SetReadDeadline(t)
}

// wokeUp reports whether err is a read ended by letIn's wake-up, and puts
// quic-go's own deadline back in force; a deadline of quic-go's (it sets
// one to stop reading when it closes) is its error.
func (c *gatedConn) wokeUp(err error) bool {
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.woken {
		return false
	}
	c.woken = false
	_ = c.UDPConn.SetReadDeadline(c.readDeadline)
	return true
}

// takeReady moves datagrams let in from the backlog into ms, in order, as
// many as fit; it returns how many.
func (c *gatedConn) takeReady(ms []ipv4.Message) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for n < len(ms) && len(c.ready) > 0 {
		d := c.ready[0]
		c.ready[0] = heldDatagram{}
		c.ready = c.ready[1:]
		m := &ms[n]
		if len(m.Buffers) == 0 || len(m.Buffers[0]) < len(d.data) || len(m.OOB) < len(d.oob) {
			continue // never with quic-go's buffers, which read it first
		}
		m.N = copy(m.Buffers[0], d.data)
		m.NN = copy(m.OOB, d.oob)
		m.Flags, m.Addr = d.flags, d.from
		n++
	}
	if len(c.ready) == 0 {
		c.ready = nil
	}
	return n
}

// ReadBatch reads as ipv4.PacketConn does and leaves out the packets the
// gate keeps or drops; datagrams let in from the backlog come first. A
// kept packet moves into a dropped one's place by copying its bytes:
// quic-go hands each message's buffer on with the message at the same
// index, so the buffers must stay where they are.
func (c *gatedConn) ReadBatch(ms []ipv4.Message, flags int) (int, error) {
	for {
		if n := c.takeReady(ms); n > 0 {
			return n, nil
		}
		if c.reading != nil {
			c.reading()
		}
		n, err := c.batch.ReadBatch(ms, flags)
		if err != nil {
			if c.wokeUp(err) {
				continue
			}
			return n, err
		}
		if n == 0 || !uniform(ms[:n]) {
			// buffers of another shape than quic-go's: the batch as
			// read, rather than a packet lost in a move
			return n, err
		}
		kept := 0
		for i := range n {
			m := &ms[i]
			if !c.pass(heldDatagram{data: m.Buffers[0][:m.N], oob: m.OOB[:m.NN], flags: m.Flags, from: m.Addr}) {
				continue
			}
			if kept != i {
				moveMessage(&ms[kept], m)
			}
			kept++
		}
		if kept > 0 {
			return kept, nil
		}
	}
}

// uniform reports whether every message has one buffer, all of the same
// size, and OOB buffers of the same size, as quic-go's do: then any
// message's packet fits in any other's place.
func uniform(ms []ipv4.Message) bool {
	for _, m := range ms {
		if len(m.Buffers) != 1 || len(m.Buffers[0]) != len(ms[0].Buffers[0]) || len(m.OOB) != len(ms[0].OOB) {
			return false
		}
	}
	return true
}

// moveMessage copies src's packet into dst's buffers, which uniform found
// as large.
func moveMessage(dst, src *ipv4.Message) {
	dst.N = copy(dst.Buffers[0], src.Buffers[0][:src.N])
	dst.NN = copy(dst.OOB, src.OOB[:src.NN])
	dst.Flags, dst.Addr = src.Flags, src.Addr
}

// QUIC versions whose Initial packets the gate knows (RFC 9000, RFC 9369).
const (
	quicV1 = 0x00000001
	quicV2 = 0x6b3343cf
)

// isInitial reports whether packet is a QUIC Initial of version 1 or 2:
// a long header (RFC 9000 17.2) whose type is Initial (0 in version 1, 1
// in version 2, RFC 9369 3.2). Anything else (short headers, Handshake
// packets, other versions, garbage) is not, and passes the gate to
// quic-go, which routes or discards it as before.
func isInitial(packet []byte) bool {
	if len(packet) < 5 || packet[0]&0xc0 != 0xc0 {
		return false
	}
	typ := packet[0] >> 4 & 0x3
	switch binary.BigEndian.Uint32(packet[1:5]) {
	case quicV1:
		return typ == 0
	case quicV2:
		return typ == 1
	}
	return false
}

// passInitial is the listener's gate. Datagrams that open no new
// connection pass: anything but an Initial, and the Initials of a
// connection that is admitted or let in (a ClientHello spans two, and
// either may be sent again). A new connection's first Initial passes while
// there is room and nobody waits before it, and takes a place among the
// connections at work at once, so a batch of Initials read together
// cannot overshoot the bounds; otherwise it waits in the backlog, or is
// dropped when the backlog is full.
func (l *Listener) passInitial(d heldDatagram) bool {
	if !isInitial(d.data) {
		return true
	}
	src := sourceAddrPort(d.from)
	now := l.now()
	a := &l.adm
	a.mu.Lock()
	l.expireRetriesLocked(now)
	if a.sources[src] > 0 || a.reserved(src) {
		a.mu.Unlock()
		return true
	}
	// a source answering the Retry it was asked once let in goes before
	// those waiting
	answer := a.check.answered(src)
	if (answer || a.backlog.len() == 0) && !l.fullLocked(now) {
		a.reserve(src, now)
		a.mu.Unlock()
		return true
	}
	waiting := a.backlog.holds(src)
	hold := a.backlog.hold
	if answer {
		hold = a.backlog.holdFirst
	}
	held := hold(src, d, now)
	ready := l.letInLocked(now)
	l.backlogMetricsLocked()
	a.mu.Unlock()
	l.handOver(ready)
	switch {
	case held && !waiting:
		l.metrics.held.Inc()
	case !held && !waiting:
		l.metrics.dropped.Inc()
		if h := l.cfg.hooks.Dropped; h != nil {
			h()
		}
	}
	return false
}

// reservationTTL is how long a place taken for a connection the gate let
// in is kept for quic-go to admit it. quic-go admits or refuses a new
// connection within moments of reading its Initial; one it never admits
// (it asked the agent to prove its address first, or the agent is gone)
// gives its place back after this.
const reservationTTL = 3 * time.Second

// reserved reports whether the gate let src in and quic-go has not
// admitted it yet.
func (a *admission) reserved(src netip.AddrPort) bool { return a.reservations.has(src) }

// reserve takes a place for src among the connections at work.
func (a *admission) reserve(src netip.AddrPort, now time.Time) { a.reservations.add(src, now) }

// unreserve gives src's place to the connection quic-go admits for it,
// reporting whether it had one.
func (a *admission) unreserve(src netip.AddrPort) bool { return a.reservations.remove(src) }

// expireReservations gives back the places of connections quic-go did
// not admit within reservationTTL.
func (a *admission) expireReservations(now time.Time) { a.reservations.expire(now, reservationTTL) }

// fullLocked reports, with a.mu held, whether a new connection must wait:
// the handshakes in progress or the connections at work (every admitted
// connection but those waiting for an approval, or on their peer past
// PeerGrace) are at their bounds,
// counting the places of connections let in and not yet admitted.
func (l *Listener) fullLocked(now time.Time) bool {
	a := &l.adm
	a.expireReservations(now)
	pending := a.reservations.len()
	if b := l.cfg.MaxHandshakes; b > 0 && a.handshakes+pending >= b {
		return true
	}
	if b := l.cfg.MaxActive; b > 0 && a.total-a.awaitingApproval-a.awaitingPeer+pending >= b {
		return true
	}
	return false
}

// letInLocked, with a.mu held, takes the oldest waiters out of the
// backlog while there is room, each with a place among the connections at
// work, and returns their datagrams for handOver.
func (l *Listener) letInLocked(now time.Time) []heldDatagram {
	a := &l.adm
	var ready []heldDatagram
	for a.backlog.len() > 0 && !l.fullLocked(now) {
		w := a.backlog.next(now)
		if w == nil {
			break
		}
		a.reserve(w.src, now)
		ready = append(ready, w.datagrams...)
		l.metrics.letIn.Inc()
	}
	return ready
}

// handOver gives datagrams let in from the backlog to the socket's reads.
func (l *Listener) handOver(ready []heldDatagram) {
	if len(ready) > 0 && l.adm.letIn != nil {
		l.adm.letIn(ready)
	}
}

// roomFreed lets waiters in from the backlog after a connection ended,
// finished its handshake or began to wait for an approval.
func (l *Listener) roomFreed() {
	a := &l.adm
	a.mu.Lock()
	if a.backlog.len() == 0 {
		a.mu.Unlock()
		return
	}
	ready := l.letInLocked(l.now())
	l.backlogMetricsLocked()
	a.mu.Unlock()
	l.handOver(ready)
}

// backlogMetricsLocked, with a.mu held, reports the backlog's size.
func (l *Listener) backlogMetricsLocked() {
	l.metrics.backlog.Set(float64(l.adm.backlog.len()))
	l.metrics.backlogBytes.Set(float64(l.adm.backlog.bytes))
}
