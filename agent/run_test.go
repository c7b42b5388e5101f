package agent_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stratumjoin/stratum/agent"
	"github.com/stratumjoin/stratum/internal/joincode"
	"github.com/stratumjoin/stratum/internal/wire"
	"github.com/stratumjoin/stratum/listener"
	"github.com/stratumjoin/stratum/listener/adminapi"
	"github.com/stratumjoin/stratum/listener/listenertest"
	"github.com/stratumjoin/stratum/pki"
)

// notes records what an agent tells its service manager.
type notes struct {
	mu     sync.Mutex
	lines  []string // "READY " + status, or "STATUS " + status
	readyC chan struct{}
	once   sync.Once
}

func newNotes() *notes { return &notes{readyC: make(chan struct{})} }

func (n *notes) Ready(status string) error {
	n.mu.Lock()
	n.lines = append(n.lines, "READY "+status)
	n.mu.Unlock()
	n.once.Do(func() { close(n.readyC) })
	return nil
}

func (n *notes) Status(status string) error {
	n.mu.Lock()
	n.lines = append(n.lines, "STATUS "+status)
	n.mu.Unlock()
	return nil
}

func (n *notes) all() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.lines...)
}

func (n *notes) count(prefix string) int {
	c := 0
	for _, l := range n.all() {
		if strings.HasPrefix(l, prefix) {
			c++
		}
	}
	return c
}

func (n *notes) last() string {
	all := n.all()
	if len(all) == 0 {
		return ""
	}
	return all[len(all)-1]
}

// waitFor polls cond for up to d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond) // polling for cond
	}
}

func mintCode(t testing.TB, l *listenertest.Listener, req adminapi.MintCodeRequest) (joincode.Secret, adminapi.Code) {
	t.Helper()
	return l.MintCode(t, req)
}

func unlimited() *int { n := 0; return &n }

// runningAgent is one agent.Run in a goroutine.
type runningAgent struct {
	dir    string
	notes  *notes
	cancel context.CancelFunc
	done   chan error
}

func startAgent(t *testing.T, endpoint string, sec joincode.Secret, dir string, clock agent.Clock, adjust func(*agent.RunConfig)) *runningAgent {
	t.Helper()
	a := &runningAgent{dir: dir, notes: newNotes(), done: make(chan error, 1)}
	cfg := agent.RunConfig{
		StateDir: dir,
		Endpoint: endpoint,
		Secret:   func() (joincode.Secret, error) { return sec, nil },
		Notifier: a.notes,
		Clock:    clock,
	}
	if adjust != nil {
		adjust(&cfg)
	}
	ctx, cancel := context.WithCancel(context.Background())
	a.cancel = cancel
	go func() { a.done <- agent.Run(ctx, cfg) }()
	t.Cleanup(func() { a.stop(t) })
	return a
}

// stop cancels the agent and returns what Run returned.
func (a *runningAgent) stop(t *testing.T) error {
	t.Helper()
	a.cancel()
	select {
	case err, ok := <-a.done:
		if ok {
			close(a.done)
		}
		return err
	case <-time.After(10 * time.Second):
		t.Fatalf("agent.Run did not return within 10s of its context ending")
		return nil
	}
}

// result waits for Run to return by itself.
func (a *runningAgent) result(t *testing.T, d time.Duration) error {
	t.Helper()
	select {
	case err := <-a.done:
		close(a.done)
		return err
	case <-time.After(d):
		t.Fatalf("agent.Run still running after %s; notes: %q", d, a.notes.all())
		return nil
	}
}

func (a *runningAgent) waitReady(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case <-a.notes.readyC:
	case <-time.After(d):
		t.Fatalf("no READY after %s; notes: %q", d, a.notes.all())
	}
}

func (a *runningAgent) identity(t *testing.T) agent.Identity {
	t.Helper()
	id, ok, err := agent.State{Dir: a.dir}.Identity()
	if err != nil || !ok {
		t.Fatalf("identity in %s: ok=%v err=%v", a.dir, ok, err)
	}
	return id
}

// fakeTimeListener starts a listener that reads the fake clock.
func fakeTimeListener(t *testing.T, clock *fakeClock) *listenertest.Listener {
	t.Helper()
	return listenertest.Start(t, listenertest.Options{
		Init:   listener.InitConfig{Now: clock.Now()},
		Config: listener.Config{Now: clock.Now},
	})
}

// TestRunRenewsBeforeExpiryOutOfStep joins a few agents at one fake
// instant, then walks the shared clock forward in small steps: each agent
// renews once, over real QUIC, inside [7/12, 3/4] of its certificate's
// life and before it expires, and they do not all renew at the same step.
func TestRunRenewsBeforeExpiryOutOfStep(t *testing.T) {
	const agents = 5
	clock := newFakeClock()
	l := fakeTimeListener(t, clock)
	sec, _ := mintCode(t, l, adminapi.MintCodeRequest{AutoApprove: true, MaxUses: unlimited()})
	var as []*runningAgent
	for i := range agents {
		as = append(as, startAgent(t, l.Endpoint, sec, filepath.Join(t.TempDir(), "a"+string(rune('0'+i))), clock, nil))
	}
	first := make([]agent.Identity, agents)
	for i, a := range as {
		a.waitReady(t, 30*time.Second)
		first[i] = a.identity(t)
	}
	clock.waitWaiters(t, agents) // every agent sleeps until its renewal
	life := first[0].NotAfter.Sub(first[0].JoinedAt)
	if life < 6*24*time.Hour {
		t.Fatalf("certificate life %s, want the default 7 days", life)
	}

	// Half the life passes at once: nobody renews that early.
	clock.Advance(life / 2)
	// settled, not slept: every agent is asleep on its timer again (none
	// is due before 7/12 of the life), so any renewal it would start has
	// been started
	clock.waitWaiters(t, agents)
	for i, a := range as {
		if a.notes.count("STATUS renewing") != 0 || a.identity(t).LastRenewal != nil {
			t.Fatalf("agent %d renewed at half its certificate's life", i)
		}
	}
	step := life / 240
	for elapsed := life / 2; elapsed < life*4/5; elapsed += step {
		clock.Advance(step)
		// settled: every agent is asleep again (renewed, or not due)
		clock.waitWaiters(t, agents)
	}
	renewedAt := map[time.Time]int{}
	for i, a := range as {
		id := a.identity(t)
		if id.LastRenewal == nil {
			t.Fatalf("agent %d never renewed; notes %q", i, a.notes.all())
		}
		at := *id.LastRenewal
		frac := float64(at.Sub(first[i].JoinedAt)) / float64(life)
		t.Logf("agent %d renewed at %.3f of its certificate's life", i, frac)
		if !at.Before(first[i].NotAfter) {
			t.Errorf("agent %d renewed at %s, after its certificate expired at %s", i, at, first[i].NotAfter)
		}
		if frac < 7.0/12-1.0/240 || frac > 9.0/12+1.0/240 {
			t.Errorf("agent %d renewed at %.3f of the life, outside [7/12, 3/4]", i, frac)
		}
		if !id.NotAfter.After(first[i].NotAfter) || id.NodeID != first[i].NodeID || id.LastError != "" {
			t.Errorf("agent %d after renewal: %+v", i, id)
		}
		if n := a.notes.count("READY"); n != 1 {
			t.Errorf("agent %d sent READY %d times", i, n)
		}
		if want := "STATUS joined as " + id.NodeID + " until " + id.NotAfter.UTC().Format(time.RFC3339); a.notes.last() != want {
			t.Errorf("agent %d last status %q, want %q", i, a.notes.last(), want)
		}
		renewedAt[at]++
	}
	if len(renewedAt) == 1 {
		t.Errorf("all %d agents renewed at the same instant", agents)
	}
}

// TestRunPinsNewCAAcrossRotation: after `ca rotate`, the next renewal
// brings a certificate of the new root and the new root is pinned; the
// node keeps its id and the code is not used again.
func TestRunPinsNewCAAcrossRotation(t *testing.T) {
	clock := newFakeClock()
	l := fakeTimeListener(t, clock)
	sec, code := mintCode(t, l, adminapi.MintCodeRequest{AutoApprove: true})
	a := startAgent(t, l.Endpoint, sec, filepath.Join(t.TempDir(), "state"), clock, nil)
	a.waitReady(t, 30*time.Second)
	before := a.identity(t)
	if before.CAFingerprint != code.CAFingerprint {
		t.Fatalf("pinned %s, code minted under %s", before.CAFingerprint, code.CAFingerprint)
	}
	ca, err := l.Admin.RotateCA(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	clock.waitWaiters(t, 1)
	clock.Advance(before.NotAfter.Sub(clock.Now()) * 4 / 5)
	waitFor(t, 30*time.Second, "renewal", func() bool { return a.identity(t).LastRenewal != nil })
	after := a.identity(t)
	if after.CAFingerprint != ca.Fingerprint || after.NodeID != before.NodeID {
		t.Fatalf("after rotation and renewal: pinned %s (new root %s), node %s (was %s)", after.CAFingerprint, ca.Fingerprint, after.NodeID, before.NodeID)
	}
	pem, err := os.ReadFile(filepath.Join(a.dir, agent.CAFile))
	if err != nil {
		t.Fatal(err)
	}
	roots, err := pki.ParseCertsPEM(pem)
	if err != nil {
		t.Fatal(err)
	}
	var fps []string
	for _, r := range roots {
		fps = append(fps, pki.FormatFingerprint(pki.FingerprintOf(r)))
	}
	if !contains(fps, ca.Fingerprint) || !contains(fps, code.CAFingerprint) {
		t.Fatalf("ca.pem holds %v, want the new root %s and the old %s while the listener still sends both", fps, ca.Fingerprint, code.CAFingerprint)
	}
	c, _ := l.Admin.Code(context.Background(), code.ID)
	if c.Uses != 1 || c.Registrations != 1 {
		t.Fatalf("the renewal re-joined: code %+v", c)
	}
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// TestRunStopsWhenNodeRevoked: a revoked node's renewal is refused for
// good; Run says so, records the error and returns without retrying.
func TestRunStopsWhenNodeRevoked(t *testing.T) {
	clock := newFakeClock()
	l := fakeTimeListener(t, clock)
	sec, _ := mintCode(t, l, adminapi.MintCodeRequest{AutoApprove: true})
	var retries int
	var mu sync.Mutex
	a := startAgent(t, l.Endpoint, sec, filepath.Join(t.TempDir(), "state"), clock, func(c *agent.RunConfig) {
		c.OnRetry = func(int, time.Duration, error) { mu.Lock(); retries++; mu.Unlock() }
	})
	a.waitReady(t, 30*time.Second)
	id := a.identity(t)
	if _, err := l.Admin.RevokeNode(context.Background(), id.NodeID); err != nil {
		t.Fatal(err)
	}
	clock.waitWaiters(t, 1)
	clock.Advance(id.NotAfter.Sub(clock.Now()) * 4 / 5)
	err := a.result(t, 30*time.Second)
	var refused *agent.RefusedError
	if !errors.Is(err, agent.ErrNeedsNewCode) || !errors.As(err, &refused) || refused.Code != wire.CodeNodeRevoked || refused.Retryable() {
		t.Fatalf("Run returned %v, want a permanent %s refusal", err, wire.CodeNodeRevoked)
	}
	mu.Lock()
	defer mu.Unlock()
	if retries != 0 {
		t.Fatalf("a revoked node's renewal was retried %d times", retries)
	}
	if last := a.notes.last(); !strings.HasPrefix(last, "STATUS refused: ") || !strings.Contains(last, "revoked") {
		t.Fatalf("last status %q", last)
	}
	if got := a.identity(t); !strings.Contains(got.LastError, wire.CodeNodeRevoked) || got.NodeID != id.NodeID {
		t.Fatalf("node.json after the refusal: %+v", got)
	}
}

// TestRunRenewsCertificateThatExpiredWhileOff: an agent stopped past its
// certificate's expiry renews before it says READY if the listener still
// knows the node, and stops asking for a new code if it does not.
func TestRunRenewsCertificateThatExpiredWhileOff(t *testing.T) {
	clock := newFakeClock()
	l := fakeTimeListener(t, clock)
	sec, _ := mintCode(t, l, adminapi.MintCodeRequest{AutoApprove: true})
	dir := filepath.Join(t.TempDir(), "state")
	a := startAgent(t, l.Endpoint, sec, dir, clock, nil)
	a.waitReady(t, 30*time.Second)
	joined := a.identity(t)
	if err := a.stop(t); err != nil {
		t.Fatalf("Run after its context ended: %v, want nil", err)
	}

	clock.Advance(joined.NotAfter.Sub(clock.Now()) + 48*time.Hour) // off for two days past expiry
	b := startAgent(t, l.Endpoint, sec, dir, clock, nil)
	b.waitReady(t, 30*time.Second)
	renewed := b.identity(t)
	notes := b.notes.all()
	if len(notes) < 2 || !strings.HasPrefix(notes[0], "STATUS certificate expired at ") || !strings.HasPrefix(notes[1], "READY joined as "+joined.NodeID) {
		t.Fatalf("notes %q: want the expiry, then READY", notes)
	}
	if !renewed.NotAfter.After(clock.Now()) || renewed.NodeID != joined.NodeID || renewed.LastRenewal == nil {
		t.Fatalf("READY with %+v at %s", renewed, clock.Now())
	}
	if err := b.stop(t); err != nil {
		t.Fatal(err)
	}

	// The listener comes back with the same CA but no memory of the node.
	l.Stop()
	pc, err := net.ListenPacket("udp", l.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	listenertest.Start(t, listenertest.Options{DataDir: l.DataDir, Config: listener.Config{
		Now: clock.Now, PacketConn: pc, StoreURL: "bolt:" + filepath.Join(t.TempDir(), "empty.db"),
	}})
	clock.Advance(renewed.NotAfter.Sub(clock.Now()) + time.Hour)
	c := startAgent(t, l.Endpoint, sec, dir, clock, nil)
	err = c.result(t, 30*time.Second)
	var refused *agent.RefusedError
	if !errors.Is(err, agent.ErrNeedsNewCode) || !errors.As(err, &refused) || refused.Code != wire.CodeNodeUnknown {
		t.Fatalf("Run returned %v, want %s and a new code needed", err, wire.CodeNodeUnknown)
	}
	if n := c.notes.count("READY"); n != 0 {
		t.Fatalf("READY sent with an expired certificate the listener does not know: %q", c.notes.all())
	}
	if last := c.notes.last(); !strings.HasPrefix(last, "STATUS refused: ") {
		t.Fatalf("last status %q", last)
	}
}

// TestRunDoesNotRetryPermanentRefusal: a refused join ends Run at once.
func TestRunDoesNotRetryPermanentRefusal(t *testing.T) {
	l := listenertest.Start(t, listenertest.Options{})
	sec, code := mintCode(t, l, adminapi.MintCodeRequest{AutoApprove: true})
	if _, err := l.Admin.RevokeCode(context.Background(), code.ID); err != nil {
		t.Fatal(err)
	}
	var retries int
	var mu sync.Mutex
	a := startAgent(t, l.Endpoint, sec, filepath.Join(t.TempDir(), "state"), nil, func(c *agent.RunConfig) {
		c.OnRetry = func(int, time.Duration, error) { mu.Lock(); retries++; mu.Unlock() }
	})
	err := a.result(t, 30*time.Second)
	var refused *agent.RefusedError
	if !errors.As(err, &refused) || refused.Code != wire.CodeRevoked {
		t.Fatalf("Run returned %v, want %s", err, wire.CodeRevoked)
	}
	mu.Lock()
	defer mu.Unlock()
	notes := a.notes.all()
	if retries != 0 || len(notes) != 2 || notes[0] != "STATUS joining "+l.Endpoint || !strings.HasPrefix(notes[1], "STATUS refused: the join code was revoked") {
		t.Fatalf("retries %d, notes %q", retries, notes)
	}
}

// TestRunStopsPromptly: the end of the context ends Run with nil while it
// waits between retries and while the listener holds the join for
// approval.
func TestRunStopsPromptly(t *testing.T) {
	t.Run("retrying", func(t *testing.T) {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		down := pc.LocalAddr().String()
		pc.Close()
		sec, _ := joincode.NewCode("AB")
		retried := make(chan struct{}, 1)
		a := startAgent(t, down, sec, filepath.Join(t.TempDir(), "state"), nil, func(c *agent.RunConfig) {
			c.JoinConfig = func(j *agent.JoinConfig) { j.DialTimeout = 100 * time.Millisecond }
			c.BackoffBase, c.BackoffMax = time.Minute, time.Minute
			c.Rand = func() float64 { return 0.9 }
			c.OnRetry = func(int, time.Duration, error) {
				select {
				case retried <- struct{}{}:
				default:
				}
			}
		})
		<-retried
		start := time.Now()
		if err := a.stop(t); err != nil || time.Since(start) > 2*time.Second {
			t.Fatalf("stop while retrying: %v after %s", err, time.Since(start))
		}
	})
	t.Run("pending", func(t *testing.T) {
		l := listenertest.Start(t, listenertest.Options{})
		sec, _ := mintCode(t, l, adminapi.MintCodeRequest{})
		a := startAgent(t, l.Endpoint, sec, filepath.Join(t.TempDir(), "state"), nil, nil)
		waitFor(t, 30*time.Second, "waiting for approval", func() bool {
			return strings.HasPrefix(a.notes.last(), "STATUS waiting for approval of join join-")
		})
		start := time.Now()
		if err := a.stop(t); err != nil || time.Since(start) > 2*time.Second {
			t.Fatalf("stop while pending: %v after %s", err, time.Since(start))
		}
		if a.notes.count("READY") != 0 {
			t.Fatal("READY while pending")
		}
	})
}

// TestRunRetriesRenewalUntilListenerIsBack: a renewal that cannot reach
// the listener is recorded (status --json shows it) and tried again with
// backoff; once the listener is back it succeeds and clears the error.
func TestRunRetriesRenewalUntilListenerIsBack(t *testing.T) {
	clock := newFakeClock()
	l := fakeTimeListener(t, clock)
	sec, _ := mintCode(t, l, adminapi.MintCodeRequest{AutoApprove: true})
	retried := make(chan error, 16)
	a := startAgent(t, l.Endpoint, sec, filepath.Join(t.TempDir(), "state"), clock, func(c *agent.RunConfig) {
		c.RenewConfig = func(r *agent.RenewConfig) { r.DialTimeout = 200 * time.Millisecond }
		c.BackoffBase, c.BackoffMax = time.Minute, time.Minute
		c.OnRetry = func(_ int, _ time.Duration, err error) { retried <- err }
	})
	a.waitReady(t, 30*time.Second)
	id := a.identity(t)
	l.Stop()

	clock.waitWaiters(t, 1)
	clock.Advance(id.NotAfter.Sub(clock.Now()) * 4 / 5)
	var err error
	select {
	case err = <-retried:
	case <-time.After(30 * time.Second):
		t.Fatalf("no retry; notes %q", a.notes.all())
	}
	var unreachable *agent.UnreachableError
	if !errors.As(err, &unreachable) {
		t.Fatalf("renewal failed with %v, want the listener unreachable", err)
	}
	if got := a.identity(t); !strings.Contains(got.LastError, "could not reach the listener") || got.LastRenewal != nil {
		t.Fatalf("node.json while the listener is down: %+v", got)
	}
	if last := a.notes.last(); !strings.HasPrefix(last, "STATUS renewal failed, retrying in ") {
		t.Fatalf("last status %q", last)
	}

	pc, err := net.ListenPacket("udp", l.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	listenertest.Start(t, listenertest.Options{DataDir: l.DataDir, Config: listener.Config{Now: clock.Now, PacketConn: pc}})
	clock.waitWaiters(t, 1) // the failed renewal waits to be tried again
	clock.Advance(time.Minute)
	waitFor(t, 30*time.Second, "renewal", func() bool { return a.identity(t).LastRenewal != nil })
	if got := a.identity(t); got.LastError != "" || !got.NotAfter.After(id.NotAfter) {
		t.Fatalf("node.json after the listener came back: %+v", got)
	}
	select {
	case err := <-a.done:
		t.Fatalf("Run returned %v", err)
	default:
	}
}
