package listener

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	dto "github.com/prometheus/client_model/go"
	"golang.org/x/net/ipv4"
)

func udpAddr(ip string, port int) *net.UDPAddr {
	return &net.UDPAddr{IP: net.ParseIP(ip), Port: port}
}

func datagram(payload string, from *net.UDPAddr) heldDatagram {
	return heldDatagram{data: []byte(payload), oob: []byte("oob:" + payload), flags: 1, from: from}
}

// heldPayloads are the payloads of w's datagrams.
func heldPayloads(w *waiter) []string {
	var out []string
	for _, d := range w.datagrams {
		out = append(out, string(d.data))
	}
	return out
}

// TestBacklogFirstComeFirstServed: waiters leave in the order they came,
// each with its datagrams (copies, with their control data and source),
// at most backlogDatagrams of them.
func TestBacklogFirstComeFirstServed(t *testing.T) {
	b := backlog{max: 10, maxWait: time.Minute}
	now := time.Unix(1000, 0)
	a, c := udpAddr("10.0.0.1", 1), udpAddr("10.0.0.2", 1)
	buf := []byte("a1")
	if !b.hold(sourceAddrPort(a), heldDatagram{data: buf, from: a}, now) {
		t.Fatal("first datagram of a not held")
	}
	buf[1] = 'X' // the socket reuses its buffers: the backlog keeps a copy
	if !b.hold(sourceAddrPort(c), datagram("c1", c), now) {
		t.Fatal("c not held")
	}
	for _, p := range []string{"a2", "a3"} {
		if !b.hold(sourceAddrPort(a), datagram(p, a), now) {
			t.Fatalf("%s not held", p)
		}
	}
	if b.hold(sourceAddrPort(a), datagram("a4", a), now) {
		t.Fatalf("a's %d-th datagram held, want at most %d", backlogDatagrams+1, backlogDatagrams)
	}
	if b.len() != 2 || !b.holds(sourceAddrPort(a)) {
		t.Fatalf("backlog of %d, holds a %v; want 2 waiters", b.len(), b.holds(sourceAddrPort(a)))
	}
	w := b.next(now)
	if w == nil || w.src != sourceAddrPort(a) || !slices.Equal(heldPayloads(w), []string{"a1", "a2", "a3"}) {
		t.Fatalf("first out: %+v, want a with a1 a2 a3", w)
	}
	if d := w.datagrams[1]; string(d.oob) != "oob:a2" || d.flags != 1 || d.from.String() != a.String() {
		t.Fatalf("a2 held as %+v, want its control data, flags and source", d)
	}
	if w := b.next(now); w == nil || w.src != sourceAddrPort(c) {
		t.Fatalf("second out: %+v, want c", w)
	}
	if w := b.next(now); w != nil || b.len() != 0 || b.bytes != 0 {
		t.Fatalf("drained backlog gives %+v, holds %d waiters and %d bytes", w, b.len(), b.bytes)
	}
}

// TestBacklogLimits: a full backlog and a source address past its share
// hold no new waiter, and a waiter older than maxWait never leaves it: its
// agent has given up.
func TestBacklogLimits(t *testing.T) {
	now := time.Unix(1000, 0)
	b := backlog{max: 3, perSource: 2, maxWait: 10 * time.Second}
	for port := range 2 {
		if !b.hold(netip.MustParseAddrPort("10.0.0.1:"+string(rune('1'+port))), datagram("x", udpAddr("10.0.0.1", 1+port)), now) {
			t.Fatalf("waiter %d from 10.0.0.1 not held", port)
		}
	}
	if b.hold(netip.MustParseAddrPort("10.0.0.1:9"), datagram("x", udpAddr("10.0.0.1", 9)), now) {
		t.Fatal("a third waiter from 10.0.0.1 held past its share of 2")
	}
	late := now.Add(5 * time.Second)
	if !b.hold(netip.MustParseAddrPort("10.0.0.2:1"), datagram("x", udpAddr("10.0.0.2", 1)), late) {
		t.Fatal("a waiter from another address not held")
	}
	if b.hold(netip.MustParseAddrPort("10.0.0.3:1"), datagram("x", udpAddr("10.0.0.3", 1)), late) {
		t.Fatal("a fourth waiter held in a backlog of 3")
	}
	// the two first have waited 11 s: gone; the last, 6 s: let in
	w := b.next(now.Add(11 * time.Second))
	if w == nil || w.src != netip.MustParseAddrPort("10.0.0.2:1") {
		t.Fatalf("after 11 s the next waiter is %+v, want 10.0.0.2:1 (the others gave up)", w)
	}
	if b.len() != 0 || b.bytes != 0 || len(b.perAddr) != 0 {
		t.Fatalf("emptied backlog holds %d waiters, %d bytes, shares %v", b.len(), b.bytes, b.perAddr)
	}
}

// gateTest is a listener with just the gate: bounds, a clock, and what it
// let in from the backlog.
type gateTest struct {
	l     *Listener
	now   time.Time
	letIn []string // the names of the Initials let in (see initial)
}

func newGateTest(maxActive, maxHandshakes, backlogSize int) *gateTest {
	g := &gateTest{now: time.Unix(1000, 0)}
	g.l = &Listener{metrics: newMetrics(func() float64 { return 0 }), cfg: Config{MaxActive: maxActive, MaxHandshakes: maxHandshakes}}
	g.l.now = func() time.Time { return g.now }
	g.l.adm.backlog = backlog{max: backlogSize, maxWait: 25 * time.Second}
	g.l.adm.sources = map[netip.AddrPort]int{}
	g.l.adm.perSource = map[netip.Addr]int{}
	g.l.adm.letIn = func(ds []heldDatagram) {
		for _, d := range ds {
			g.letIn = append(g.letIn, string(d.data[len(initialPacket):]))
		}
	}
	return g
}

var (
	initialPacket   = initialHeader(0xc3, quicV1)
	handshakePacket = initialHeader(0xe3, quicV1)
)

// initial is an Initial datagram whose bytes after the header name it.
func initial(name string, from *net.UDPAddr) heldDatagram {
	return heldDatagram{data: append(slices.Clone(initialPacket), name...), from: from}
}

// admit stands for quic-go admitting the connection the gate let in from
// src: its place moves from the reservations to the connections at work.
func (g *gateTest) admit(src *net.UDPAddr) {
	a := &g.l.adm
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.unreserve(sourceAddrPort(src)) {
		panic("admitted without a reservation")
	}
	a.total++
	a.sources[sourceAddrPort(src)]++
}

// end stands for an admitted connection from src ending.
func (g *gateTest) end(src *net.UDPAddr) {
	a := &g.l.adm
	a.mu.Lock()
	a.total--
	a.sources[sourceAddrPort(src)]--
	a.mu.Unlock()
	g.l.roomFreed()
}

// TestGateHoldsNewConnectionsPastTheBound: with room a new connection's
// Initial passes and takes a place at once; past the bound Initials wait
// in the backlog and are let in oldest first as connections end, and the
// Initials of a connection admitted or let in, and anything that is not
// an Initial, always pass.
func TestGateHoldsNewConnectionsPastTheBound(t *testing.T) {
	g := newGateTest(2, 100, 10)
	l := g.l
	a, b, c, d := udpAddr("10.0.0.1", 1), udpAddr("10.0.0.2", 1), udpAddr("10.0.0.3", 1), udpAddr("10.0.0.4", 1)
	if !l.passInitial(initial("a1", a)) || !l.passInitial(initial("b1", b)) {
		t.Fatal("Initials with room did not pass")
	}
	// two places taken, though quic-go has admitted neither yet
	if l.passInitial(initial("c1", c)) {
		t.Fatal("a third connection passed a bound of 2")
	}
	if !l.passInitial(initial("a2", a)) {
		t.Fatal("the second Initial of a connection let in did not pass")
	}
	if !l.passInitial(heldDatagram{data: handshakePacket, from: d}) {
		t.Fatal("a Handshake packet did not pass")
	}
	g.admit(a)
	g.admit(b)
	if !l.passInitial(initial("a3", a)) {
		t.Fatal("an admitted connection's Initial sent again did not pass")
	}
	l.passInitial(initial("c2", c))
	l.passInitial(initial("d1", d))
	if st := l.ConnStats(); st.Backlog != 2 {
		t.Fatalf("backlog %d, want c and d", st.Backlog)
	}
	// c's two datagrams and d's one wait
	var m dto.Metric
	if err := l.metrics.backlogBytes.Write(&m); err != nil {
		t.Fatal(err)
	}
	if got, want := m.GetGauge().GetValue(), float64(3*(len(initialPacket)+2)); got != want {
		t.Fatalf("backlog bytes %v, want %v for c1, c2 and d1", got, want)
	}
	g.end(a)
	if !slices.Equal(g.letIn, []string{"c1", "c2"}) {
		t.Fatalf("let in %q, want c's two Initials", g.letIn)
	}
	if !l.passInitial(initial("c3", c)) {
		t.Fatal("an Initial of a connection let in from the backlog did not pass")
	}
	// a newcomer waits behind d, and d goes first
	e := udpAddr("10.0.0.5", 1)
	g.admit(c)
	if l.passInitial(initial("e1", e)) {
		t.Fatal("a newcomer passed while d waited")
	}
	g.letIn = nil
	g.end(b)
	if !slices.Equal(g.letIn, []string{"d1"}) {
		t.Fatalf("let in %q, want d alone, before e", g.letIn)
	}
}

// TestGateCountsHandshakesAndApprovals: the handshake bound holds new
// connections too, a join waiting for an approval gives its place up, and
// a place the gate took for a connection quic-go never admitted is given
// back after reservationTTL.
func TestGateCountsHandshakesAndApprovals(t *testing.T) {
	g := newGateTest(100, 1, 10)
	l := g.l
	a, b := udpAddr("10.0.0.1", 1), udpAddr("10.0.0.2", 1)
	if !l.passInitial(initial("a1", a)) || l.passInitial(initial("b1", b)) {
		t.Fatal("the handshake bound of 1 did not hold the second connection")
	}
	// a's reservation outlives reservationTTL: quic-go never admitted it
	g.now = g.now.Add(reservationTTL + time.Millisecond)
	l.roomFreed()
	if !slices.Equal(g.letIn, []string{"b1"}) {
		t.Fatalf("after a's place expired, let in %q, want b", g.letIn)
	}

	g = newGateTest(1, 100, 10)
	l = g.l
	if !l.passInitial(initial("a1", a)) {
		t.Fatal("first connection held")
	}
	g.admit(a)
	if l.passInitial(initial("b1", b)) {
		t.Fatal("second connection passed a bound of 1 at work")
	}
	l.awaitApproval(true)
	if !slices.Equal(g.letIn, []string{"b1"}) {
		t.Fatalf("a join waiting for approval left room, yet let in %q", g.letIn)
	}
	if st := l.ConnStats(); st.AwaitingApproval != 1 || st.Backlog != 0 {
		t.Fatalf("stats %+v, want one join awaiting approval and an empty backlog", st)
	}
}

// TestGateDropsPastAFullBacklog: a new connection finds the backlog full
// and its Initial is dropped and counted; its agent sends it again.
func TestGateDropsPastAFullBacklog(t *testing.T) {
	g := newGateTest(1, 100, 1)
	dropped := 0
	g.l.cfg.hooks.Dropped = func() { dropped++ }
	l := g.l
	l.passInitial(initial("a1", udpAddr("10.0.0.1", 1)))
	l.passInitial(initial("b1", udpAddr("10.0.0.2", 1)))
	if l.passInitial(initial("c1", udpAddr("10.0.0.3", 1))) || dropped != 1 {
		t.Fatalf("past a full backlog: %d dropped, want 1", dropped)
	}
	if st := l.ConnStats(); st.Backlog != 1 {
		t.Fatalf("backlog %d, want b alone", st.Backlog)
	}
}

// TestGatedConnLetInWakesTheRead: a read blocked on a quiet socket returns
// the datagrams let in from the backlog, in order, with their sources and
// control data, and then reads the socket again.
func TestGatedConnLetInWakesTheRead(t *testing.T) {
	server, client := udpPair(t)
	gc := newGatedConn(server, func(heldDatagram) bool { return true })
	// letIn comes once the read has found nothing ready and goes to the
	// socket, where nothing arrives
	toSocket := make(chan struct{}, 1)
	gc.reading = func() {
		select {
		case toSocket <- struct{}{}:
		default:
		}
	}
	ms := quicGoMessages(3)
	read := make(chan []string, 1)
	errs := make(chan error, 1)
	go func() {
		n, err := gc.ReadBatch(ms, 0)
		if err != nil {
			errs <- err
			return
		}
		var got []string
		for i := range n {
			got = append(got, string(ms[i].Buffers[0][:ms[i].N])+"|"+string(ms[i].OOB[:ms[i].NN])+"|"+ms[i].Addr.String())
		}
		read <- got
	}()
	<-toSocket
	from := udpAddr("10.0.0.7", 7)
	gc.letIn([]heldDatagram{datagram("one", from), datagram("two", from)})
	select {
	case got := <-read:
		want := []string{"one|oob:one|10.0.0.7:7", "two|oob:two|10.0.0.7:7"}
		if !slices.Equal(got, want) {
			t.Fatalf("read %q, want %q", got, want)
		}
	case err := <-errs:
		t.Fatalf("woken read failed: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("a read blocked on a quiet socket was not woken by letIn")
	}
	if _, err := client.Write([]byte("after")); err != nil {
		t.Fatal(err)
	}
	n, err := gc.ReadBatch(ms, 0)
	if err != nil || n != 1 || string(ms[0].Buffers[0][:ms[0].N]) != "after" {
		t.Fatalf("read after the wake: %d %v", n, err)
	}
}

// TestGatedConnKeepsQuicGoDeadline: the deadline quic-go sets (it sets one
// in the past to stop its read loop when it closes) ends a read with its
// error whether or not a wake-up came first, and a wake-up leaves it in
// force.
func TestGatedConnKeepsQuicGoDeadline(t *testing.T) {
	server, _ := udpPair(t)
	gc := newGatedConn(server, func(heldDatagram) bool { return true })
	ms := quicGoMessages(2)

	gc.letIn([]heldDatagram{datagram("x", udpAddr("10.0.0.1", 1))})
	if err := gc.SetReadDeadline(time.Now()); err != nil {
		t.Fatal(err)
	}
	n, err := gc.ReadBatch(ms, 0)
	if err != nil || n != 1 {
		t.Fatalf("read with a datagram let in: %d %v, want it", n, err)
	}
	if _, err := gc.ReadBatch(ms, 0); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past quic-go's deadline after a wake-up: %v, want the deadline's error", err)
	}

	// a wake-up while quic-go's future deadline stands: the read after
	// the woken one still ends at that deadline
	if err := gc.SetReadDeadline(time.Now().Add(200 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	gc.letIn([]heldDatagram{datagram("y", udpAddr("10.0.0.1", 1))})
	if n, err := gc.ReadBatch(ms, 0); err != nil || n != 1 {
		t.Fatalf("woken read: %d %v", n, err)
	}
	done := make(chan error, 1)
	go func() { _, err := gc.ReadBatch(ms, 0); done <- err }()
	select {
	case err := <-done:
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("read after the wake-up: %v, want quic-go's deadline", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("quic-go's deadline was lost after a wake-up: the read blocked past it")
	}
}

func udpPair(t *testing.T) (*net.UDPConn, *net.UDPConn) {
	t.Helper()
	server, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { server.Close() })
	client, err := net.DialUDP("udp", nil, server.LocalAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	return server, client
}

// quicGoMessages are messages as quic-go reads into them: one buffer and
// one OOB buffer each, all of one size.
func quicGoMessages(n int) []ipv4.Message {
	ms := make([]ipv4.Message, n)
	for i := range ms {
		ms[i].Buffers = [][]byte{make([]byte, 1500)}
		ms[i].OOB = make([]byte, 128)
	}
	return ms
}

// TestPeerWaitsPastTheGraceLeaveRoom: a connection waiting on its peer
// keeps its place at work for PeerGrace, then gives it up to the next in
// the backlog until its wait ends; a shorter wait changes nothing.
func TestPeerWaitsPastTheGraceLeaveRoom(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGateTest(1, 100, 10)
		g.l.cfg.PeerGrace = time.Second
		l := g.l
		a, b := udpAddr("10.0.0.1", 1), udpAddr("10.0.0.2", 1)
		if !l.passInitial(initial("a1", a)) {
			t.Fatal("first connection held")
		}
		g.admit(a)
		if l.passInitial(initial("b1", b)) {
			t.Fatal("second connection passed a bound of 1 at work")
		}
		short := l.waitOnPeer()
		time.Sleep(500 * time.Millisecond)
		short()
		time.Sleep(time.Second)
		if st := l.ConnStats(); st.AwaitingPeer != 0 || len(g.letIn) != 0 {
			t.Fatalf("after a wait shorter than the grace: %+v, let in %q", st, g.letIn)
		}
		long := l.waitOnPeer()
		time.Sleep(time.Second)
		synctest.Wait()
		if st := l.ConnStats(); st.AwaitingPeer != 1 || !slices.Equal(g.letIn, []string{"b1"}) {
			t.Fatalf("a second into a wait on the peer: %+v, let in %q; want a's place given to b", st, g.letIn)
		}
		long()
		long() // ending twice counts once
		if st := l.ConnStats(); st.AwaitingPeer != 0 {
			t.Fatalf("after the wait ended: %+v", st)
		}
	})
}
