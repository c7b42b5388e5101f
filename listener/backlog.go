package listener

import (
	"net"
	"net/netip"
	"time"
)

// Past its bound on connections at work the listener holds the first
// datagrams of new connections in a backlog, in the order they came, and
// hands them to quic-go as connections end: the QUIC counterpart of a
// kernel's SYN backlog. A held agent costs the listener its datagrams
// (two Initials of about 1.2 KiB for a ClientHello with a post-quantum key
// share), where a connection at work costs some 100 KiB; it is let in as
// soon as there is room, first come first served, where dropping its
// Initials left it to probe on timers that double (0.3 s to 10 s), so that
// once slots were scarce the newest agents took them and the oldest timed
// out and came back as new connections (docs/hardening.md).

// backlogDatagrams is the most datagrams held for one connection: its
// first flight (a ClientHello spans two Initials) and one sent again. The
// agent's QUIC stack sends the same Initials again while it waits; more of
// them would add nothing.
const backlogDatagrams = 3

// heldDatagram is a datagram as read from the socket: its bytes, its
// control data (quic-go reads the address it was sent to from them, to
// answer from that address) and its source.
type heldDatagram struct {
	data  []byte
	oob   []byte
	flags int
	from  net.Addr
}

// waiter is one connection in the backlog.
type waiter struct {
	src       netip.AddrPort
	since     time.Time
	datagrams []heldDatagram
}

// backlog is the queue of connections waiting for room. It is not safe
// for concurrent use: the listener's admission lock guards it.
type backlog struct {
	max       int           // waiters held at most; past it new ones are dropped
	perSource int           // waiters from one address at most (<= 0: no share)
	maxWait   time.Duration // a waiter older than this has given up: never let in

	queue    []*waiter // oldest first; queue[head:] are live or expired
	head     int
	bySource map[netip.AddrPort]*waiter
	perAddr  map[netip.Addr]int
	bytes    int
}

// len is how many connections wait.
func (b *backlog) len() int { return len(b.bySource) }

// holds reports whether src waits in the backlog.
func (b *backlog) holds(src netip.AddrPort) bool {
	_, ok := b.bySource[src]
	return ok
}

// hold adds a copy of a datagram of src's connection: to its place if it
// waits already, else as a new waiter at the end. It reports whether the
// datagram is held; a full backlog, or a source past its share, drops it.
func (b *backlog) hold(src netip.AddrPort, d heldDatagram, now time.Time) bool {
	b.expire(now)
	w, ok := b.bySource[src]
	if !ok {
		if len(b.bySource) >= b.max || (b.perSource > 0 && b.perAddr[src.Addr()] >= b.perSource) {
			return false
		}
		if b.bySource == nil {
			b.bySource, b.perAddr = map[netip.AddrPort]*waiter{}, map[netip.Addr]int{}
		}
		w = &waiter{src: src, since: now}
		b.bySource[src] = w
		b.perAddr[src.Addr()]++
		b.queue = append(b.queue, w)
	}
	if len(w.datagrams) >= backlogDatagrams {
		return false
	}
	// one allocation for the bytes and the control data
	buf := make([]byte, len(d.data)+len(d.oob))
	copy(buf, d.data)
	copy(buf[len(d.data):], d.oob)
	w.datagrams = append(w.datagrams, heldDatagram{data: buf[:len(d.data):len(d.data)], oob: buf[len(d.data):], flags: d.flags, from: d.from})
	b.bytes += len(buf)
	return true
}

// holdFirst is hold for a connection that goes before those waiting: a
// source answering the Retry it was asked when it was let in.
func (b *backlog) holdFirst(src netip.AddrPort, d heldDatagram, now time.Time) bool {
	if b.holds(src) {
		return b.hold(src, d, now)
	}
	if !b.hold(src, d, now) {
		return false
	}
	w := b.queue[len(b.queue)-1]
	b.queue = b.queue[:len(b.queue)-1]
	if b.head > 0 {
		b.head--
		b.queue[b.head] = w
	} else {
		b.queue = append([]*waiter{w}, b.queue...)
	}
	return true
}

// next takes the oldest waiter that has not given up out of the backlog,
// or returns nil when none waits.
func (b *backlog) next(now time.Time) *waiter {
	b.expire(now)
	if b.head == len(b.queue) {
		return nil
	}
	w := b.queue[b.head]
	b.pop()
	return w
}

// expire drops the waiters at the front that have waited longer than
// maxWait: their agents have given up, and letting them in would hold a
// slot for a handshake nobody completes.
func (b *backlog) expire(now time.Time) {
	for b.head < len(b.queue) && now.Sub(b.queue[b.head].since) > b.maxWait {
		b.pop()
	}
}

// pop removes the waiter at the front.
func (b *backlog) pop() {
	w := b.queue[b.head]
	b.queue[b.head] = nil
	b.head++
	delete(b.bySource, w.src)
	if b.perAddr[w.src.Addr()]--; b.perAddr[w.src.Addr()] <= 0 {
		delete(b.perAddr, w.src.Addr())
	}
	for _, d := range w.datagrams {
		b.bytes -= len(d.data) + len(d.oob)
	}
	// the queue's array is let go once drained, or compacted once its
	// dead front is most of it
	switch {
	case b.head == len(b.queue):
		b.queue, b.head = nil, 0
	case b.head > 1024 && b.head > len(b.queue)/2:
		b.queue = append([]*waiter(nil), b.queue[b.head:]...)
		b.head = 0
	}
}
