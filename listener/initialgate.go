package listener

import (
	"encoding/binary"
	"net"

	"golang.org/x/net/ipv4"
)

// Past the handshake bound the listener drops the Initial packets that
// would open new connections, unanswered, as a kernel drops the SYNs of a
// full accept queue. Refusing them instead (CONNECTION_REFUSED) costs the
// listener little, but each refused agent then makes a new connection: a
// new TLS key share, and for `stratum-agent join` a new process. On a
// machine its agents share, a herd of 10,000 token joins fell into refusal
// storms that way (1,800-15,000 refusals, p99 47-61 s against 31-36 s in
// the runs without one). A dropped Initial is sent again by the agent's
// QUIC stack on its probe timer, the same packet with the same key share,
// at intervals that double, so a waiting agent costs next to nothing and is
// admitted by the first Initial that arrives once a slot is free; its
// handshake timeout (10 s) ends the wait when none frees.

// gatedConn is the listener's UDP socket with the gate in its reads. It
// keeps every method of *net.UDPConn, so quic-go still reads in batches
// and sends with GSO: quic-go reads through a connection's own ReadBatch
// when it has one.
type gatedConn struct {
	*net.UDPConn
	batch *ipv4.PacketConn
	drop  func(packet []byte, from net.Addr) bool
}

func newGatedConn(c *net.UDPConn, drop func([]byte, net.Addr) bool) *gatedConn {
	return &gatedConn{UDPConn: c, batch: ipv4.NewPacketConn(c), drop: drop}
}

// ReadBatch reads as ipv4.PacketConn does and leaves out the packets the
// gate drops. A kept packet moves into a dropped one's place by copying
// its bytes: quic-go hands each message's buffer on with the message at
// the same index, so the buffers must stay where they are.
func (c *gatedConn) ReadBatch(ms []ipv4.Message, flags int) (int, error) {
	for {
		n, err := c.batch.ReadBatch(ms, flags)
		if err != nil || n == 0 || !uniform(ms[:n]) {
			// buffers of another shape than quic-go's: the batch as
			// read, rather than a packet lost in a move
			return n, err
		}
		kept := 0
		for i := range n {
			m := &ms[i]
			if c.drop(m.Buffers[0][:m.N], m.Addr) {
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

// dropInitial is the listener's gate: while the handshake bound is full, an
// Initial from a source address no admitted connection has is dropped.
// The Initials of an admitted handshake (a ClientHello spans two, and
// either may be sent again) come from its own address and pass. A second
// Initial read before quic-go admitted the first of its connection can be
// dropped too; it is sent again within a probe interval.
func (l *Listener) dropInitial(packet []byte, from net.Addr) bool {
	a := &l.adm
	if !a.full.Load() || !isInitial(packet) {
		return false
	}
	src := sourceAddrPort(from)
	a.mu.Lock()
	_, known := a.sources[src]
	a.mu.Unlock()
	if known {
		return false
	}
	l.metrics.dropped.Inc()
	if h := l.cfg.hooks.Dropped; h != nil {
		h()
	}
	return true
}
