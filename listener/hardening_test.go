package listener_test

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/stratumjoin/stratum/agent"
	"github.com/stratumjoin/stratum/internal/forgedquic"
	"github.com/stratumjoin/stratum/internal/joincode"
	"github.com/stratumjoin/stratum/internal/wire"
	"github.com/stratumjoin/stratum/listener"
	"github.com/stratumjoin/stratum/listener/adminapi"
	"github.com/stratumjoin/stratum/listener/listenertest"
)

// honestSource is another source than the attacker's 127.0.0.1, in
// another /24: every 127/8 address is the loopback.
const honestSource = "127.0.1.2"

// dialFrom returns a QUIC dial whose packets leave from ip.
func dialFrom(t testing.TB, ip string) func(ctx context.Context, ep string, tc *tls.Config, qc *quic.Config) (*quic.Conn, error) {
	t.Helper()
	pc, err := net.ListenPacket("udp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	tr := &quic.Transport{Conn: pc}
	t.Cleanup(func() { tr.Close(); pc.Close() })
	return func(ctx context.Context, ep string, tc *tls.Config, qc *quic.Config) (*quic.Conn, error) {
		addr, err := net.ResolveUDPAddr("udp", ep)
		if err != nil {
			return nil, err
		}
		return tr.Dial(ctx, addr, tc, qc)
	}
}

func joinFrom(t testing.TB, l *listenertest.Listener, ip string, sec joincode.Secret) (*agent.Joined, string, error) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "state")
	j, err := agent.Join(context.Background(), agent.JoinConfig{StateDir: dir, Endpoint: l.Endpoint, Secret: sec, Dial: dialFrom(t, ip)})
	return j, dir, err
}

// TestSelectorSweepFromOneSourceBurnsNothing: one address sends 11 Hellos
// to each of 64 live codes' selectors. At most the address's budget of
// codes ends with a counted attempt, none is burned, every start past the
// budget is told JOIN_RATE_LIMITED before any KE2, and a holder from
// another source joins at once.
func TestSelectorSweepFromOneSourceBurnsNothing(t *testing.T) {
	var counted atomic.Int32
	l := listenertest.Start(t, listenertest.Options{Config: listener.WithHooks(listener.Config{BudgetWait: 50 * time.Millisecond},
		listener.Hooks{Challenge: func(_ string, real, c bool) { counted.Add(btoi(real && c)) }})})
	var secs []joincode.Secret
	var ids []string
	for range 64 {
		sec, c := mint(t, l, adminapi.MintCodeRequest{AutoApprove: true})
		secs, ids = append(secs, sec), append(ids, c.ID)
	}
	var challenges, limited, turnedAway atomic.Int32
	jobs := make(chan joincode.Secret)
	var wg sync.WaitGroup
	for range 48 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for bad := range jobs {
				out, err := rawJoin{Secret: bad, StopAfterChallenge: true}.run(context.Background(), l.Endpoint)
				var te *quic.TransportError
				switch {
				case errors.As(err, &te) && te.ErrorCode == quic.ConnectionRefused:
					// past the source's share of connections (closing ones
					// linger on a slow machine): no start at all
					turnedAway.Add(1)
				case err != nil:
					t.Errorf("sweep start: %v", err)
				case len(out.Results) == 1:
					if r := out.Results[0]; r.Code != wire.CodeRateLimited || r.RetryAfter <= 0 {
						t.Errorf("refusal %+v", r)
					}
					limited.Add(1)
				default:
					challenges.Add(1)
				}
			}
		}()
	}
	for _, sec := range secs {
		for range 11 {
			jobs <- wrongCode(t, sec)
		}
	}
	close(jobs)
	wg.Wait()
	withCount, burned := 0, 0
	for _, id := range ids {
		c, err := l.Admin.Code(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if c.FailedAttempts > 0 {
			withCount++
		}
		if c.State != "live" {
			burned++
		}
	}
	t.Logf("704 sweep starts: %d Challenges, %d JOIN_RATE_LIMITED, %d connections refused; %d codes with a counted attempt, %d burned", challenges.Load(), limited.Load(), turnedAway.Load(), withCount, burned)
	if challenges.Load() > 8 || challenges.Load()+limited.Load()+turnedAway.Load() != 704 || limited.Load() == 0 || withCount > 8 || burned != 0 || counted.Load() > 8 {
		t.Fatalf("sweep: %d Challenges (%d counted), %d limited, %d codes counted, %d burned", challenges.Load(), counted.Load(), limited.Load(), withCount, burned)
	}
	start := time.Now()
	if _, _, err := joinFrom(t, l, honestSource, secs[0]); err != nil {
		t.Fatalf("honest holder from %s after the sweep: %v", honestSource, err)
	}
	t.Logf("honest join from %s took %s", honestSource, time.Since(start))
}

func lenHeld(mu *sync.Mutex, held *[]*quic.Conn) int {
	mu.Lock()
	defer mu.Unlock()
	return len(*held)
}

func btoi(b bool) int32 {
	if b {
		return 1
	}
	return 0
}

// TestProvenStartsGiveTheirBudgetBack: one address makes many more proven
// joins than its budget of unproven starts, none refused.
func TestProvenStartsGiveTheirBudgetBack(t *testing.T) {
	l := listenertest.Start(t, listenertest.Options{Config: listener.Config{UnprovenPerSource: 2, BudgetWait: time.Millisecond}})
	sec, _ := mint(t, l, adminapi.MintCodeRequest{AutoApprove: true, MaxUses: uses(0)})
	for i := range 6 {
		if _, _, err := join(t, l, sec, wire.Facts{}); err != nil {
			t.Fatalf("join %d: %v", i, err)
		}
	}
	// two guesses spend the budget: the next start, right code or not, is
	// told to come back later
	for range 2 {
		if _, _, err := join(t, l, wrongCode(t, sec), wire.Facts{}); !errors.Is(err, agent.ErrNotAccepted) {
			t.Fatalf("guess: %v", err)
		}
	}
	_, _, err := join(t, l, sec, wire.Facts{})
	var refused *agent.RefusedError
	if !errors.As(err, &refused) || refused.Code != wire.CodeRateLimited || refused.RetryAfter <= 0 || !refused.Retryable() {
		t.Fatalf("start over budget: %v", err)
	}
}

// TestStalledConnectionsShutOutNoOne: 2,100 connections from one source
// complete the handshake and open no stream. The source holds only its
// share, a join and a renewal from another source both succeed during the
// attack, and the listener closes every stalled connection for opening no
// stream.
func TestStalledConnectionsShutOutNoOne(t *testing.T) {
	l := listenertest.Start(t, listenertest.Options{Config: listener.Config{RetryAbove: 1e6}})
	renewer, _ := mint(t, l, adminapi.MintCodeRequest{AutoApprove: true})
	_, renewDir, err := joinFrom(t, l, honestSource, renewer)
	if err != nil {
		t.Fatal(err)
	}
	sec, _ := mint(t, l, adminapi.MintCodeRequest{AutoApprove: true})

	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tr := &quic.Transport{Conn: pc}
	t.Cleanup(func() { tr.Close(); pc.Close() })
	udp, _ := net.ResolveUDPAddr("udp", l.Endpoint)
	var mu sync.Mutex
	var held []*quic.Conn
	var refused atomic.Int32
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64)
	attackStart := time.Now()
	go func() {
		for range 2100 {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				c, err := tr.Dial(ctx, udp, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{wire.ALPNJoin}, MinVersion: tls.VersionTLS13},
					&quic.Config{HandshakeIdleTimeout: 10 * time.Second, MaxIdleTimeout: 60 * time.Second})
				if err != nil {
					refused.Add(1)
					return
				}
				mu.Lock()
				held = append(held, c)
				mu.Unlock()
			}()
		}
	}()
	// once the source holds its whole share, from another source: a join
	// and a renewal
	deadline := time.Now().Add(60 * time.Second)
	for l.ConnStats().PerSource["127.0.0.1"] < 64 {
		if time.Now().After(deadline) {
			t.Fatalf("the attack never filled its share: %+v", l.ConnStats())
		}
		time.Sleep(5 * time.Millisecond) // polling for the share above
	}
	during := l.ConnStats()
	// An agent retries a transient failure, and so does this one, a few
	// times: on a loaded machine quic-go refuses a handshake when its
	// accept queue (32) is momentarily full of the attacker's. A refusal
	// for good, or more than a few transient ones, fails the test.
	transient := func(what string, try func() error) {
		for i := 1; ; i++ {
			err := try()
			var unreachable *agent.UnreachableError
			if err == nil {
				if i > 1 {
					t.Logf("%s took %d tries", what, i)
				}
				return
			}
			if !errors.As(err, &unreachable) || i == 5 {
				t.Fatalf("%s during the stall, try %d: %v", what, i, err)
			}
			time.Sleep(200 * time.Millisecond) // an agent's backoff before its retry
		}
	}
	transient("join", func() error { _, _, err := joinFrom(t, l, honestSource, sec); return err })
	transient("renewal", func() error {
		_, err := agent.Renew(context.Background(), agent.RenewConfig{StateDir: renewDir, Dial: dialFrom(t, honestSource)})
		return err
	})
	after := l.ConnStats()
	t.Logf("the attacker held %d connections as the honest join began and %d once the renewal ended", during.PerSource["127.0.0.1"], after.PerSource["127.0.0.1"])
	for len(sem) > 0 || refused.Load()+int32(lenHeld(&mu, &held)) < 2100 {
		if time.Now().After(deadline) {
			t.Fatalf("the attack's dials did not end: %d refused, %d held", refused.Load(), lenHeld(&mu, &held))
		}
		time.Sleep(10 * time.Millisecond) // polling for the condition above
	}
	wg.Wait()
	if st := l.ConnStats(); st.PerSource["127.0.0.1"] > 64 {
		t.Fatalf("one source holds %d connections", st.PerSource["127.0.0.1"])
	}
	t.Logf("2,100 stalled dials: %d completed, %d refused", len(held), refused.Load())

	// every stalled connection the listener took is closed for opening no
	// stream (not left to an idle timeout)
	for _, c := range held {
		select {
		case <-c.Context().Done():
		case <-time.After(30 * time.Second):
			t.Fatal("a stalled connection is still open 30s on")
		}
		var ae *quic.ApplicationError
		if err := context.Cause(c.Context()); !errors.As(err, &ae) || !ae.Remote || ae.ErrorMessage != "no stream" {
			t.Fatalf("stalled connection ended with %v, want the listener's \"no stream\"", err)
		}
	}
	t.Logf("every stalled connection closed %s after the attack began", time.Since(attackStart).Round(time.Millisecond))
}

// TestJoinFloodLeavesRenewalsTheirSlots: with every join slot held, a
// join is refused and a renewal still succeeds.
func TestJoinFloodLeavesRenewalsTheirSlots(t *testing.T) {
	l := listenertest.Start(t, listenertest.Options{Config: listener.Config{MaxConnections: 2, PerSourceConnections: -1}})
	sec, _ := mint(t, l, adminapi.MintCodeRequest{AutoApprove: true, MaxUses: uses(2)})
	_, dir, err := join(t, l, sec, wire.Facts{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for range 2 {
		c, err := dialJoin(ctx, l.Endpoint)
		if err != nil {
			t.Fatal(err)
		}
		defer c.CloseWithError(0, "")
		str, err := c.OpenStreamSync(ctx)
		if err != nil {
			t.Fatal(err)
		}
		str.Write([]byte{0}) // the listener takes the stream and waits for a Hello
	}
	deadline := time.Now().Add(20 * time.Second)
	for l.ConnStats().Joins < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("join slots not held: %+v", l.ConnStats())
		}
		time.Sleep(10 * time.Millisecond) // polling for the condition above
	}
	_, err = agent.Join(ctx, agent.JoinConfig{StateDir: filepath.Join(t.TempDir(), "s"), Endpoint: l.Endpoint, Secret: sec, DialTimeout: 2 * time.Second})
	var unreachable *agent.UnreachableError
	if !errors.As(err, &unreachable) {
		t.Fatalf("join past the join slots: %v, want it turned away", err)
	}
	if _, err := agent.Renew(ctx, agent.RenewConfig{StateDir: dir}); err != nil {
		t.Fatalf("renewal with every join slot held: %v", err)
	}
}

// TestWeakKeyRenewalIsAnsweredCSRInvalid: a renewal whose CSR carries a
// key the cluster refuses (RSA 1024) is answered CSR_INVALID, and the
// agent reads it rather than seeing the connection closed.
func TestWeakKeyRenewalIsAnsweredCSRInvalid(t *testing.T) {
	f := joinedNode(t, wire.Facts{})
	weak, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, weak)
	if err != nil {
		t.Fatal(err)
	}
	res, err := rawRenew(t, f, csr)
	if err != nil || res.Status != wire.StatusRefused || res.Code != wire.CodeBadCSR {
		t.Fatalf("weak-key renewal: %+v %v, want CSR_INVALID", res, err)
	}
	n, _ := f.l.Admin.Node(context.Background(), f.id.NodeID)
	if n.RenewedAt != nil {
		t.Fatal("a refused renewal was recorded")
	}
}

// rawRenew renews f's node over stratum-node/1 with csr instead of one
// for the node's key.
func rawRenew(t *testing.T, f *renewFixture, csr []byte) (wire.Result, error) {
	t.Helper()
	st := agent.State{Dir: f.dir}
	key, err := st.Key()
	if err != nil {
		t.Fatal(err)
	}
	chain, err := st.Chain()
	if err != nil {
		t.Fatal(err)
	}
	cert := tls.Certificate{PrivateKey: key, Leaf: chain[0]}
	for _, c := range chain {
		cert.Certificate = append(cert.Certificate, c.Raw)
	}
	ctx := context.Background()
	conn, err := quic.DialAddr(ctx, f.l.Endpoint, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{wire.ALPNNode}, MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert}},
		&quic.Config{HandshakeIdleTimeout: 10 * time.Second})
	if err != nil {
		return wire.Result{}, err
	}
	defer conn.CloseWithError(0, "")
	str, err := conn.OpenStreamSync(ctx)
	if err != nil {
		return wire.Result{}, err
	}
	if err := wire.Write(str, &wire.Renew{CSR: csr}); err != nil {
		return wire.Result{}, err
	}
	var res wire.Result
	err = wire.Read(str, &res)
	return res, err
}

// TestWeakKeyJoinIsReadByTheAgent: a proven join whose CSR carries a weak
// key is answered CSR_INVALID, and it is not a failed guess: the code's
// failed count stays 0 and the code still joins.
func TestWeakKeyJoinIsReadByTheAgent(t *testing.T) {
	l := listenertest.Start(t, listenertest.Options{})
	sec, code := mint(t, l, adminapi.MintCodeRequest{AutoApprove: true})
	weak, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, weak)
	if err != nil {
		t.Fatal(err)
	}
	out, err := rawJoin{Secret: sec, CSR: csr}.run(context.Background(), l.Endpoint)
	if err != nil || len(out.Results) != 1 || out.Results[0].Code != wire.CodeBadCSR {
		t.Fatalf("weak-key join: %v %+v", err, out.Results)
	}
	c, _ := l.Admin.Code(context.Background(), code.ID)
	if c.FailedAttempts != 0 || c.Uses != 0 {
		t.Fatalf("a proven join with a weak key counted: %+v", c)
	}
	if _, _, err := join(t, l, sec, wire.Facts{}); err != nil {
		t.Fatalf("the code no longer joins: %v", err)
	}
}

// TestAgentBoundsItsWaitForAResult: a listener that goes silent after the
// Proof does not hold the agent: it gives up after its Result timeout
// with an error worth retrying.
func TestAgentBoundsItsWaitForAResult(t *testing.T) {
	release := make(chan struct{})
	l := listenertest.Start(t, listenertest.Options{Config: listener.WithHooks(listener.Config{}, listener.Hooks{
		Proof: func(string) { <-release }, // the listener goes silent
	})})
	defer close(release)
	sec, _ := mint(t, l, adminapi.MintCodeRequest{AutoApprove: true})
	done := make(chan error, 1)
	go func() {
		_, err := agent.Join(context.Background(), agent.JoinConfig{StateDir: filepath.Join(t.TempDir(), "s"), Endpoint: l.Endpoint, Secret: sec, ResultTimeout: time.Second})
		done <- err
	}()
	select {
	case err := <-done:
		var unreachable *agent.UnreachableError
		if !errors.As(err, &unreachable) {
			t.Fatalf("join against a silent listener: %v, want an unreachable error", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the agent still waits for a Result 60s on")
	}
}

// TestPendingResultAnnouncesTheHold: a pending Result says how long the
// listener holds the join open.
func TestPendingResultAnnouncesTheHold(t *testing.T) {
	l := listenertest.Start(t, listenertest.Options{})
	sec, _ := mint(t, l, adminapi.MintCodeRequest{})
	out, err := rawJoin{Secret: sec, StopAtPending: true}.run(context.Background(), l.Endpoint)
	if err != nil || len(out.Results) != 1 {
		t.Fatalf("pending join: %v %+v", err, out.Results)
	}
	if r := out.Results[0]; r.Status != wire.StatusPending || r.PendingFor < 23*3600 || r.PendingFor > 24*3600 {
		t.Fatalf("pending result %+v, want PendingFor about 24h", r)
	}
}

// stallHandshake holds one of l's handshake slots with a client that
// stops in the middle of its handshake until release closes; the returned
// channel reports how that handshake ended.
func stallHandshake(t *testing.T, l *listenertest.Listener, release <-chan struct{}) <-chan error {
	t.Helper()
	held := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := quic.DialAddr(ctx, l.Endpoint, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{wire.ALPNJoin}, MinVersion: tls.VersionTLS13,
			VerifyPeerCertificate: func([][]byte, [][]*x509.Certificate) error { <-release; return nil }},
			&quic.Config{HandshakeIdleTimeout: 20 * time.Second})
		if err == nil {
			c.CloseWithError(0, "")
		}
		held <- err
	}()
	deadline := time.Now().Add(20 * time.Second)
	for l.ConnStats().Handshakes < 1 {
		if time.Now().After(deadline) {
			t.Fatalf("the stalled handshake was never admitted: %+v", l.ConnStats())
		}
		time.Sleep(5 * time.Millisecond) // polling for the condition above
	}
	return held
}

// TestHandshakeBoundHoldsNewConnections: with the handshake bound held by
// a handshake in progress, a join waits in the backlog, unanswered (not
// refused: a refused agent would pay for a new connection), and once the
// held handshake completes it is let in and the join completes.
func TestHandshakeBoundHoldsNewConnections(t *testing.T) {
	l := listenertest.Start(t, listenertest.Options{Config: listener.Config{MaxHandshakes: 1, PerSourceConnections: -1, RetryAbove: 1e6, MetricsListen: "127.0.0.1:0"}})
	sec, _ := mint(t, l, adminapi.MintCodeRequest{AutoApprove: true, MaxUses: uses(2)})
	release := make(chan struct{})
	held := stallHandshake(t, l, release)

	joined := make(chan error, 1)
	go func() {
		_, err := agent.Join(context.Background(), agent.JoinConfig{StateDir: filepath.Join(t.TempDir(), "s"), Endpoint: l.Endpoint, Secret: sec, DialTimeout: 15 * time.Second})
		joined <- err
	}()
	waitFor(t, "the join waiting in the backlog", func() bool {
		select {
		case err := <-joined:
			t.Fatalf("join past the handshake bound ended before it waited: %v", err)
		default:
		}
		return l.ConnStats().Backlog == 1
	})
	close(release)
	if err := <-held; err != nil {
		t.Fatalf("the stalled handshake, let go: %v", err)
	}
	if err := <-joined; err != nil {
		t.Fatalf("join held past the bound, once it is free: %v", err)
	}
	_, body := get(t, "http://"+l.MetricsAddr().String()+"/metrics")
	counts := map[string]float64{}
	for line := range strings.SplitSeq(body, "\n") {
		for _, name := range []string{"stratum_listener_backlog_held_total", "stratum_listener_backlog_let_in_total", "stratum_listener_initials_dropped_total"} {
			if v, ok := strings.CutPrefix(line, name+" "); ok {
				var n float64
				fmt.Sscan(v, &n)
				counts[name] = n
			}
		}
	}
	if counts["stratum_listener_backlog_held_total"] != 1 || counts["stratum_listener_backlog_let_in_total"] != 1 || counts["stratum_listener_initials_dropped_total"] != 0 {
		t.Fatalf("backlog metrics %v, want one held and let in, none dropped", counts)
	}
}

// TestBacklogIsFirstComeFirstServed: past the bound on connections at
// work, waiting joins are let in in the order they came.
func TestBacklogIsFirstComeFirstServed(t *testing.T) {
	l := listenertest.Start(t, listenertest.Options{Config: listener.Config{MaxActive: 1, PerSourceConnections: -1, RetryAbove: 1e6}})
	sec, _ := mint(t, l, adminapi.MintCodeRequest{AutoApprove: true, MaxUses: uses(4)})
	release := make(chan struct{})
	held := stallHandshake(t, l, release)
	done := make(chan int, 3)
	for i := range 3 {
		go func() {
			_, err := agent.Join(context.Background(), agent.JoinConfig{StateDir: filepath.Join(t.TempDir(), "s"), Endpoint: l.Endpoint, Secret: sec})
			if err != nil {
				t.Errorf("join %d: %v", i, err)
			}
			done <- i
		}()
		waitFor(t, fmt.Sprintf("join %d waiting", i), func() bool { return l.ConnStats().Backlog == i+1 })
	}
	close(release)
	if err := <-held; err != nil {
		t.Fatalf("the stalled handshake, let go: %v", err)
	}
	var order []int
	for range 3 {
		select {
		case i := <-done:
			order = append(order, i)
		case <-time.After(60 * time.Second):
			t.Fatalf("joins done %v after 60s", order)
		}
	}
	if !slices.Equal(order, []int{0, 1, 2}) {
		t.Fatalf("joins completed in the order %v, want the order they came in", order)
	}
}

// TestStalledPeersDoNotHoldTheListener: connections whose peers complete
// the handshake and then do nothing hold every place at work for
// PeerGrace only; then a join waiting in the backlog is let in and
// completes while they are still connected.
func TestStalledPeersDoNotHoldTheListener(t *testing.T) {
	const grace = 200 * time.Millisecond
	l := listenertest.Start(t, listenertest.Options{Config: listener.Config{MaxActive: 2, PeerGrace: grace, FirstStream: time.Minute, PerSourceConnections: -1, RetryAbove: 1e6}})
	sec, _ := mint(t, l, adminapi.MintCodeRequest{AutoApprove: true})
	for range 2 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		conn, err := quic.DialAddr(ctx, l.Endpoint, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{wire.ALPNJoin}, MinVersion: tls.VersionTLS13}, &quic.Config{KeepAlivePeriod: time.Second})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		defer conn.CloseWithError(0, "")
	}
	start := time.Now()
	if _, _, err := join(t, l, sec, wire.Facts{}); err != nil {
		t.Fatalf("join while two stalled connections held the two places: %v", err)
	}
	if d := time.Since(start); d < grace {
		t.Fatalf("the join completed in %v, before the stalled connections' grace of %v ran out", d, grace)
	}
	if st := l.ConnStats(); st.Total < 2 || st.AwaitingPeer != 2 {
		t.Fatalf("stats %+v after the join, want the two stalled connections still open, waiting on their peers", st)
	}
}

// TestApprovalWaitIsNotAtWork: a join waiting for an approval keeps its
// connection but not its place among the connections at work, so with
// room for one, another machine joins meanwhile.
func TestApprovalWaitIsNotAtWork(t *testing.T) {
	l := listenertest.Start(t, listenertest.Options{Config: listener.Config{MaxActive: 1, PerSourceConnections: -1, RetryAbove: 1e6}})
	held, _ := mint(t, l, adminapi.MintCodeRequest{MaxUses: uses(1)})
	free, _ := mint(t, l, adminapi.MintCodeRequest{AutoApprove: true, MaxUses: uses(1)})
	waiting := startJoin(t, l, held, filepath.Join(t.TempDir(), "held"), wire.Facts{})
	joinID := waiting.waitPending(t)
	if st := l.ConnStats(); st.AwaitingApproval != 1 || st.Total != 1 {
		t.Fatalf("stats %+v, want the one connection awaiting approval", st)
	}
	if _, err := startJoin(t, l, free, filepath.Join(t.TempDir(), "free"), wire.Facts{}).wait(t); err != nil {
		t.Fatalf("join beside one awaiting approval, with room for one at work: %v", err)
	}
	decide(t, l, joinID, true)
	if _, err := waiting.wait(t); err != nil {
		t.Fatalf("approved join: %v", err)
	}
}

// TestHandshakeBoundOutlastsTheDial: a join that waits in the backlog
// for longer than its dial timeout fails as unreachable (worth retrying),
// not as refused; once it has waited longer than the backlog's wait it is
// never let in, so the next join finds the bound free.
func TestHandshakeBoundOutlastsTheDial(t *testing.T) {
	l := listenertest.Start(t, listenertest.Options{Config: listener.Config{MaxHandshakes: 1, PerSourceConnections: -1, RetryAbove: 1e6, BacklogWait: time.Second}})
	sec, _ := mint(t, l, adminapi.MintCodeRequest{AutoApprove: true})
	release := make(chan struct{})
	held := stallHandshake(t, l, release)
	_, err := agent.Join(context.Background(), agent.JoinConfig{StateDir: filepath.Join(t.TempDir(), "s"), Endpoint: l.Endpoint, Secret: sec, DialTimeout: time.Second})
	var unreachable *agent.UnreachableError
	var te *quic.TransportError
	if !errors.As(err, &unreachable) || errors.As(err, &te) {
		t.Fatalf("join past the handshake bound for longer than its dial: %v, want unreachable without a transport error", err)
	}
	close(release)
	if err := <-held; err != nil {
		t.Fatalf("the stalled handshake, let go: %v", err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for l.ConnStats().Handshakes != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the completed handshake still holds its slot: %+v", l.ConnStats())
		}
		time.Sleep(5 * time.Millisecond) // polling for the condition above
	}
	if _, _, err := join(t, l, sec, wire.Facts{}); err != nil {
		t.Fatalf("join once the bound is free: %v", err)
	}
}

// forgeInitials sends the first flight of n connections, each from a
// socket of its own that never reads (package forgedquic).
func forgeInitials(t *testing.T, endpoint string, n int) {
	t.Helper()
	for range n {
		stop, err := forgedquic.Send(endpoint, "127.0.0.1:0", wire.ALPNJoin)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(stop)
	}
}

// TestForgedSourcesMeetRetries: handshakes from forged sources, which
// never complete, turn on the address checks; then new forged connections
// get a Retry each and no handshake, and an honest agent proves its
// address and joins.
func TestForgedSourcesMeetRetries(t *testing.T) {
	// the forged sockets are not *net.UDPConn, whose buffers quic-go sizes
	t.Setenv("QUIC_GO_DISABLE_RECEIVE_BUFFER_WARNING", "true")
	var verified atomic.Int32
	l := listenertest.Start(t, listenertest.Options{Config: listener.WithHooks(listener.Config{PerSourceConnections: -1, RetryAbove: 1e6, MetricsListen: "127.0.0.1:0"}, listener.Hooks{
		Accept: func(v bool) {
			if v {
				verified.Add(1)
			}
		},
	})})
	sec, _ := mint(t, l, adminapi.MintCodeRequest{AutoApprove: true})
	metric := func(name string) float64 {
		_, body := get(t, "http://"+l.MetricsAddr().String()+"/metrics")
		for line := range strings.SplitSeq(body, "\n") {
			if v, ok := strings.CutPrefix(line, name+" "); ok {
				var n float64
				fmt.Sscan(v, &n)
				return n
			}
		}
		t.Fatalf("/metrics has no %s", name)
		return 0
	}
	// 20 forged handshakes time out (5 s) and turn the checks on
	forgeInitials(t, l.Endpoint, 20)
	waitFor(t, "the forged handshakes admitted", func() bool { return l.ConnStats().Handshakes == 20 })
	waitFor(t, "the address checks on", func() bool { return metric("stratum_listener_address_checks") == 1 })
	waitFor(t, "the forged handshakes over", func() bool { return l.ConnStats().Handshakes == 0 })
	if got := metric("stratum_listener_handshake_failures_total"); got != 20 {
		t.Fatalf("%v handshake failures counted, want the 20 forged", got)
	}

	retries := metric("stratum_listener_quic_retries_total")
	forgeInitials(t, l.Endpoint, 20)
	waitFor(t, "a Retry for each new forged connection", func() bool { return metric("stratum_listener_quic_retries_total") >= retries+20 })
	if st := l.ConnStats(); st.Handshakes != 0 || st.Total != 0 {
		t.Fatalf("forged connections admitted while the checks are on: %+v", st)
	}
	if _, err := agent.Join(context.Background(), agent.JoinConfig{StateDir: filepath.Join(t.TempDir(), "s"), Endpoint: l.Endpoint, Secret: sec}); err != nil {
		t.Fatalf("honest join while the checks are on: %v", err)
	}
	if verified.Load() != 1 {
		t.Fatalf("%d connections proved their address, want the honest agent's", verified.Load())
	}
}
