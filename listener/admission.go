package listener

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/stratumjoin/stratum/internal/cluster"
	"github.com/stratumjoin/stratum/internal/wire"
)

// Defaults of the admission limits (docs/hardening.md explains each).
const (
	defaultMaxRenewals          = 512
	defaultPerSourceConnections = 64
	defaultFirstStream          = 5 * time.Second
	defaultRenewGrace           = 96 * time.Hour
	defaultBudgetWait           = 10 * time.Second
	// maxRetryAfter is the longest a start over budget is told to wait.
	maxRetryAfter = 30 * time.Second
)

// admission holds the connection counts the accept path checks.
type admission struct {
	mu        sync.Mutex
	perSource map[netip.Addr]int
	total     int

	handshakes int // admitted connections whose handshake is in progress
	// awaitingApproval counts the admitted joins waiting for a person, and
	// awaitingPeer the connections that have waited on their peer longer
	// than PeerGrace: neither is at work, nor counts against MaxActive.
	awaitingApproval int
	awaitingPeer     int
	// sources counts the admitted connections by address and port, whose
	// Initials pass the gate (passInitial).
	sources   map[netip.AddrPort]int
	accepters int // accepters waiting for a handshake to complete (see acceptPool)
	// The gate's state: connections waiting for room, the places taken
	// for those it let in until quic-go admits them, and how it hands
	// their datagrams to the socket's reads (gatedConn.letIn; nil without
	// a gate).
	backlog      backlog
	reservations sourceTimes
	letIn        func([]heldDatagram)
	// check is when new connections must prove their address
	// (addresscheck.go).
	check addressCheck

	joins    atomic.Int64 // join connections being served
	renewals atomic.Int64 // renewal connections being served

	// refunded is closed and replaced at each refund, waking starts that
	// wait for their source's budget.
	refundMu sync.Mutex
	refunded chan struct{}
	// warned is when each source was last logged as over its budget.
	warned map[netip.Addr]time.Time
}

var (
	errSourceShare = errors.New("too many connections from this source")
	errBusy        = errors.New("too many handshakes in progress")
)

// handshakeSlot is a connection's place among the handshakes in
// progress; it is given back once, when the handshake completes or the
// connection ends.
type handshakeSlot struct {
	once sync.Once
	free func(completed bool)
}

// release gives the place back; completed says whether the handshake
// completed, the first call deciding.
func (s *handshakeSlot) release(completed bool) {
	if s != nil {
		s.once.Do(func() { s.free(completed) })
	}
}

type handshakeKey struct{}

// handshakeOf is the slot admit gave the connection whose context ctx is.
func handshakeOf(ctx context.Context) *handshakeSlot {
	s, _ := ctx.Value(handshakeKey{}).(*handshakeSlot)
	return s
}

// defaultMaxHandshakes is Config.MaxHandshakes' default: enough
// handshakes in progress to keep the CPUs busy across long round trips,
// few enough that each one finishes well inside its timeouts when a herd
// arrives at once.
func defaultMaxHandshakes() int { return 256 * runtime.GOMAXPROCS(0) }

// defaultMaxActive is Config.MaxActive's default. A connection at work
// costs the listener some 100 KiB (quic-go's and crypto/tls's state and
// its goroutines' stacks), twice that between collections. 128 a CPU keep
// the CPUs busy over round trips of a few hundred milliseconds; a herd of
// 10,000 token joins on two cores ran as fast with 256 at work as with
// 512 (344 joins/s), its listener's anonymous memory peaking at 75 MiB
// instead of 102-121.
func defaultMaxActive() int { return 128 * runtime.GOMAXPROCS(0) }

// defaultPeerGrace is Config.PeerGrace's default: an honest agent answers
// within round trips and its key stretching (some 5 ms), and in a herd of
// 10,000 on two cores, its own machine shared, most within a second.
const defaultPeerGrace = time.Second

// Defaults of the backlog of new connections waiting for room.
const (
	defaultBacklog = 16384
	// defaultBacklogWait is how long a new connection may wait: the
	// agent's dial timeout (agent.DefaultDialTimeout, 30 s) less the
	// time its handshake needs once let in on a busy listener.
	defaultBacklogWait = 25 * time.Second
)

func sourceAddr(a net.Addr) netip.Addr { return sourceAddrPort(a).Addr() }

// sourceAddrPort is a's address, unmapped from IPv6, and port.
func sourceAddrPort(a net.Addr) netip.AddrPort {
	if ua, ok := a.(*net.UDPAddr); ok {
		ip, _ := netip.AddrFromSlice(ua.IP)
		return netip.AddrPortFrom(ip.Unmap(), uint16(ua.Port))
	}
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return netip.AddrPort{}
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// admit runs before the handshake, when the ALPN is not known yet. It
// refuses a source past its share of the connections, and any connection
// past a hard bound on everything in flight (joins, renewals and
// handshakes). The slot is freed when the connection ends.
func (l *Listener) admit(ctx context.Context, ci *quic.ClientInfo) (context.Context, error) {
	src, srcPort := sourceAddr(ci.RemoteAddr), sourceAddrPort(ci.RemoteAddr)
	a := &l.adm
	a.mu.Lock()
	if a.perSource == nil {
		a.perSource = map[netip.Addr]int{}
		a.sources = map[netip.AddrPort]int{}
	}
	hard := 2 * (l.cfg.MaxConnections + l.cfg.MaxRenewals)
	if a.total >= hard {
		a.mu.Unlock()
		return nil, errTooManyConnections
	}
	if share := l.cfg.PerSourceConnections; share > 0 && a.perSource[src] >= share {
		a.mu.Unlock()
		return nil, errSourceShare
	}
	// The gate let this connection in and took its place among the
	// connections at work (passInitial). Without a gate (a PacketConn
	// that is not a UDP socket) a connection past the handshake bound is
	// refused at its first packet: quic-go runs every admitted handshake
	// at once, so admitting it would slow all of them until they time out
	// together and a herd makes no progress at all.
	bound := l.cfg.MaxHandshakes
	if !a.unreserve(srcPort) && a.letIn == nil && bound > 0 && a.handshakes >= bound {
		a.mu.Unlock()
		return nil, errBusy
	}
	a.perSource[src]++
	a.sources[srcPort]++
	a.total++
	a.handshakes++
	startAccepter := a.needAccepter()
	a.mu.Unlock()
	if startAccepter {
		l.startAccepter()
	}
	// the handshake waits on the agent for its next flight
	handshaking := l.waitOnPeer()
	slot := &handshakeSlot{free: func(completed bool) {
		handshaking()
		a.mu.Lock()
		a.handshakes--
		a.mu.Unlock()
		if !completed {
			l.handshakeFailed()
		}
		l.roomFreed()
	}}
	ctx = context.WithValue(ctx, handshakeKey{}, slot)
	// quic-go cancels ctx when the connection closes or its handshake fails
	context.AfterFunc(ctx, func() {
		slot.release(false)
		a.mu.Lock()
		a.total--
		if a.perSource[src]--; a.perSource[src] <= 0 {
			delete(a.perSource, src)
		}
		if a.sources[srcPort]--; a.sources[srcPort] <= 0 {
			delete(a.sources, srcPort)
		}
		a.mu.Unlock()
		l.roomFreed()
	})
	if h := l.cfg.hooks.Accept; h != nil {
		h(ci.AddrVerified)
	}
	return ctx, nil
}

// ConnStats is what the admission path holds now.
type ConnStats struct {
	Joins, Renewals int // connections past the handshake, by ALPN
	Total           int // every admitted connection, handshakes included
	Handshakes      int // admitted, handshake in progress
	Accepters       int // waiting for handshakes to complete
	// AwaitingApproval are joins waiting for a person; AwaitingPeer,
	// connections that have waited on their peer longer than PeerGrace;
	// Backlog, the new connections waiting for room.
	AwaitingApproval int
	AwaitingPeer     int
	Backlog          int
	PerSource        map[string]int
}

// ConnStats reports the admitted connections (tests, benchmarks).
func (l *Listener) ConnStats() ConnStats {
	a := &l.adm
	a.mu.Lock()
	defer a.mu.Unlock()
	s := ConnStats{Joins: int(a.joins.Load()), Renewals: int(a.renewals.Load()), Total: a.total, Handshakes: a.handshakes, Accepters: a.accepters,
		AwaitingApproval: a.awaitingApproval, AwaitingPeer: a.awaitingPeer, Backlog: a.backlog.len(), PerSource: map[string]int{}}
	for k, v := range a.perSource {
		s.PerSource[k.String()] = v
	}
	return s
}

// handshakesInProgress is the stratum_listener_handshakes gauge.
func (l *Listener) handshakesInProgress() float64 {
	l.adm.mu.Lock()
	defer l.adm.mu.Unlock()
	return float64(l.adm.handshakes)
}

// awaitApproval marks a join as waiting for a person (true) or at work
// again (false). A join held for approval may wait a day: it keeps its
// connection but not its place among the connections at work.
func (l *Listener) awaitApproval(waiting bool) {
	a := &l.adm
	a.mu.Lock()
	if waiting {
		a.awaitingApproval++
	} else {
		a.awaitingApproval--
	}
	a.mu.Unlock()
	if waiting {
		l.roomFreed()
	}
}

// waitOnPeer marks the start of a wait on a connection's peer (the next
// flight of its handshake, its stream, a frame, its close); the returned
// func marks the end, and may be called again. A wait longer than
// PeerGrace gives up the connection's place among the connections at work
// until it ends, as a join waiting for an approval does: a peer that
// stalls, or many that do, cannot hold the listener's places and keep new
// agents waiting in the backlog, while slow honest agents keep theirs
// through their first second. The connection itself stays bounded by
// --max-connections and --max-handshakes.
func (l *Listener) waitOnPeer() (done func()) {
	if l.cfg.PeerGrace <= 0 {
		return func() {}
	}
	a := &l.adm
	var state atomic.Int32 // waiting, gave its place up, done
	const waiting, gaveUp, ended = 0, 1, 2
	t := time.AfterFunc(l.cfg.PeerGrace, func() {
		if !state.CompareAndSwap(waiting, gaveUp) {
			return
		}
		a.mu.Lock()
		a.awaitingPeer++
		a.mu.Unlock()
		l.roomFreed()
	})
	return func() {
		t.Stop()
		if state.Swap(ended) == gaveUp {
			a.mu.Lock()
			a.awaitingPeer--
			a.mu.Unlock()
		}
	}
}

// fromPeer runs read, a wait on the connection's peer (see waitOnPeer).
func (l *Listener) fromPeer(read func() error) error {
	defer l.waitOnPeer()()
	return read()
}

// slot takes a served slot for the connection's ALPN: joins and renewals
// are bounded apart, so a join flood never shuts renewals out.
func (l *Listener) slot(alpn string) (release func(), ok bool) {
	c, max := &l.adm.joins, int64(l.cfg.MaxConnections)
	if alpn == wire.ALPNNode {
		c, max = &l.adm.renewals, int64(l.cfg.MaxRenewals)
	}
	if c.Add(1) > max {
		c.Add(-1)
		return nil, false
	}
	return func() { c.Add(-1) }, true
}

type chargeKey struct{}

// startCharge is the budget charge of the join running on a connection;
// once the start is proven, Join's first Prove gives it back in the
// transaction that records the join, or refundProven does on the paths
// that end before one commits.
type startCharge struct {
	once  sync.Once
	ch    cluster.Charge
	mu    sync.Mutex
	given bool // by a Prove that committed it
}

type sourceKey struct{}

// withSource names the address a join connection comes from, for the
// budget of unproven starts.
func withSource(ctx context.Context, src netip.Addr) context.Context {
	return context.WithValue(ctx, sourceKey{}, src)
}

// startBudget is the budget a join start whose Hello names locator is
// charged to, or nil when it is not charged: a token's or key's start
// (nothing burns them, and nothing is written for them before the KE2,
// cluster.CountsBeforeKE2), a start whose source is not known, or a
// listener with the budget off. Begin charges it in the transaction that
// counts the start, and answers a source over budget before it looks the
// locator up, so that answer depends on the shape its sender chose and
// never on whether a secret has it.
func (l *Listener) startBudget(ctx context.Context, locator string) *cluster.StartBudget {
	src, ok := ctx.Value(sourceKey{}).(netip.Addr)
	if !ok || !cluster.CountsBeforeKE2(locator) || l.cfg.UnprovenPerSource < 0 {
		return nil
	}
	return &cluster.StartBudget{Source: src, Budget: cluster.Budget{PerAddress: l.cfg.UnprovenPerSource, PerPrefix: l.cfg.UnprovenPerPrefix, Window: l.cfg.BudgetWindow}}
}

// withCharge keeps a counted start's budget charge for Prove or
// refundProven to give back.
func withCharge(ctx context.Context, ch cluster.Charge) context.Context {
	if !ch.Charged() {
		return ctx
	}
	return context.WithValue(ctx, chargeKey{}, &startCharge{ch: ch})
}

// overBudget answers a start whose source stayed over its budget for
// BudgetWait: come back when a slot frees, within a second and
// maxRetryAfter. A slot frees only when a charge ages out of the window
// or is refunded, whatever the source is told, so honest holders are
// told to come back soon (their own starts may be refunded by then), not
// when the oldest charge ages out.
func (l *Listener) overBudget(ctx context.Context, att cluster.Attempt) *wire.Result {
	if src, ok := ctx.Value(sourceKey{}).(netip.Addr); ok {
		l.warnOverBudget(src)
	}
	return rateLimitedResult(min(max(att.RetryAfter, time.Second), maxRetryAfter))
}

func (l *Listener) refundSignal() <-chan struct{} {
	a := &l.adm
	a.refundMu.Lock()
	defer a.refundMu.Unlock()
	if a.refunded == nil {
		a.refunded = make(chan struct{})
	}
	return a.refunded
}

// refundProven gives a proven start's budget charge back (once), in a
// transaction of its own: for the proven starts that end before Prove
// commits (a bad CSR, a failed attestation, a store error).
func (l *Listener) refundProven(ctx context.Context) {
	sc, _ := ctx.Value(chargeKey{}).(*startCharge)
	if sc == nil {
		return
	}
	sc.once.Do(func() {
		sc.mu.Lock()
		sc.given = true
		sc.mu.Unlock()
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if err := l.cluster.Refund(rctx, sc.ch); err != nil {
			l.logger.Warn("refund start budget", "err", err)
			return
		}
		l.refundedOne()
	})
}

// budgetCharge is the start's charge for Prove to give back in its own
// transaction; zero once it has been given back.
func budgetCharge(ctx context.Context) cluster.Charge {
	sc, _ := ctx.Value(chargeKey{}).(*startCharge)
	if sc == nil {
		return cluster.Charge{}
	}
	var ch cluster.Charge
	sc.mu.Lock()
	if !sc.given {
		ch = sc.ch
	}
	sc.mu.Unlock()
	return ch
}

// refundedByProve records that a Prove carrying the start's charge
// committed: the charge is back, and refundProven has nothing left to do.
func (l *Listener) refundedByProve(ctx context.Context) {
	sc, _ := ctx.Value(chargeKey{}).(*startCharge)
	if sc == nil {
		return
	}
	sc.once.Do(func() {
		sc.mu.Lock()
		sc.given = true
		sc.mu.Unlock()
		l.refundedOne()
	})
}

// refundedOne wakes the starts waiting for a refund.
func (l *Listener) refundedOne() {
	a := &l.adm
	a.refundMu.Lock()
	if a.refunded != nil {
		close(a.refunded)
		a.refunded = nil
	}
	a.refundMu.Unlock()
}

// warnOverBudget logs a source over its budget once per window, so an
// operator sees a sweep without one line per refused start.
func (l *Listener) warnOverBudget(src netip.Addr) {
	a := &l.adm
	a.refundMu.Lock()
	now := l.now()
	if a.warned == nil {
		a.warned = map[netip.Addr]time.Time{}
	}
	last, seen := a.warned[src]
	fresh := !seen || now.Sub(last) > l.cfg.BudgetWindow
	if fresh {
		if len(a.warned) > 4096 {
			for k, t := range a.warned {
				if now.Sub(t) > l.cfg.BudgetWindow {
					delete(a.warned, k)
				}
			}
		}
		a.warned[src] = now
	}
	a.refundMu.Unlock()
	if fresh {
		l.logger.Warn("source over its budget of unproven join starts; its starts are refused JOIN_RATE_LIMITED until its charges age out of the window",
			"source", src.String(), "prefix", cluster.SourcePrefix(src).String(), "window", l.cfg.BudgetWindow.String())
	}
}

// rateLimited answers a start over its source's budget: before any KE2,
// and the same whatever locator the Hello names.
func rateLimitedResult(after time.Duration) *wire.Result {
	secs := int64((after + time.Second - 1) / time.Second)
	return &wire.Result{
		Status: wire.StatusRefused, Code: wire.CodeRateLimited, RetryAfter: secs,
		Message: "too many unproven join attempts from this address; try again later",
	}
}

// sweepBudgets drops the budget entries of sources not seen for a while.
func (l *Listener) sweepBudgets(ctx context.Context) {
	every(ctx, time.Minute, func() {
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if err := l.cluster.SweepBudgets(sctx, l.cfg.BudgetWindow); err != nil {
			l.logger.Debug("sweep start budgets", "err", err)
		}
	})
}
