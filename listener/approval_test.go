package listener_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stratumjoin/stratum/agent"
	"github.com/stratumjoin/stratum/internal/cluster"
	"github.com/stratumjoin/stratum/internal/joincode"
	"github.com/stratumjoin/stratum/internal/wire"
	"github.com/stratumjoin/stratum/listener"
	"github.com/stratumjoin/stratum/listener/adminapi"
	"github.com/stratumjoin/stratum/listener/listenertest"
	"github.com/stratumjoin/stratum/pki"
)

// bgJoin is an agent.Join running in the background.
type bgJoin struct {
	dir     string
	pending chan string // join ids, as the listener announces them
	done    chan error
	joined  *agent.Joined
	cancel  context.CancelFunc
}

func startJoin(t *testing.T, l *listenertest.Listener, sec joincode.Secret, dir string, facts wire.Facts) *bgJoin {
	t.Helper()
	return startJoinAt(t, l, sec, dir, facts, nil)
}

// startJoinAt is startJoin for an agent whose clock is now.
func startJoinAt(t *testing.T, l *listenertest.Listener, sec joincode.Secret, dir string, facts wire.Facts, now func() time.Time) *bgJoin {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	b := &bgJoin{dir: dir, pending: make(chan string, 4), done: make(chan error, 1), cancel: cancel}
	go func() {
		j, err := agent.Join(ctx, agent.JoinConfig{StateDir: dir, Endpoint: l.Endpoint, Secret: sec, Facts: facts, Now: now,
			OnPending: func(p agent.Pending) { b.pending <- p.JoinID }})
		b.joined = j
		b.done <- err
	}()
	t.Cleanup(cancel)
	return b
}

// waitPending returns the join id the listener holds this join under.
func (b *bgJoin) waitPending(t *testing.T) string {
	t.Helper()
	select {
	case id := <-b.pending:
		return id
	case err := <-b.done:
		t.Fatalf("join ended (%v) instead of waiting for approval", err)
	case <-time.After(30 * time.Second):
		t.Fatal("no pending announcement after 30s")
	}
	return ""
}

// wait returns the join's outcome.
func (b *bgJoin) wait(t *testing.T) (*agent.Joined, error) {
	t.Helper()
	select {
	case err := <-b.done:
		return b.joined, err
	case <-time.After(30 * time.Second):
		t.Fatal("join still running after 30s")
	}
	return nil, nil
}

// drop ends the agent's side while it waits, as a lost connection would.
func (b *bgJoin) drop(t *testing.T) {
	t.Helper()
	b.cancel()
	start := time.Now()
	if _, err := b.wait(t); err == nil {
		t.Fatal("a dropped join reported success")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("the join took %s to notice its context ended", d)
	}
}

func decide(t *testing.T, l *listenertest.Listener, joinID string, approve bool) {
	t.Helper()
	if _, err := l.Admin.DecideJoin(context.Background(), joinID, approve, ""); err != nil {
		t.Fatalf("decide %s: %v", joinID, err)
	}
}

func codeUses(t *testing.T, l *listenertest.Listener, id string) adminapi.Code {
	t.Helper()
	c, err := l.Admin.Code(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// keyFingerprint is the SHA-256 of node.key's public key, as the listener
// records it for a join.
func keyFingerprint(t *testing.T, dir string) string {
	t.Helper()
	key, err := agent.State{Dir: dir}.Key()
	if err != nil {
		t.Fatal(err)
	}
	spki, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		t.Fatal(err)
	}
	fp := sha256.Sum256(spki)
	return hex.EncodeToString(fp[:])
}

func findJoin(t *testing.T, l *listenertest.Listener, id string) cluster.Join {
	t.Helper()
	js, err := l.Admin.Joins(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range js {
		if j.ID == id {
			return j
		}
	}
	t.Fatalf("join %s not listed among %d joins", id, len(js))
	return cluster.Join{}
}

// TestApprovalApproveIssuesCertificate: a proven join with an approval
// code waits in pending with the claimed facts and the key's fingerprint;
// once approved, the same connection gets its certificate.
func TestApprovalApproveIssuesCertificate(t *testing.T) {
	l := listenertest.Start(t, listenertest.Options{})
	sec, code := mint(t, l, adminapi.MintCodeRequest{})
	facts := wire.Facts{Hostname: "gpu-07", ProductUUID: "4C4C4544-0042-3510-8051-B7C04F4E3732", MACs: []string{"b8:3f:d2:00:00:07"}}
	dir := filepath.Join(t.TempDir(), "state")
	b := startJoin(t, l, sec, dir, facts)
	joinID := b.waitPending(t)

	j := findJoin(t, l, joinID)
	if !j.IsPending() || j.SecretID != code.ID || j.KeyFP != keyFingerprint(t, dir) || j.Facts.Hostname != "gpu-07" || j.Facts.ProductUUID != facts.ProductUUID {
		t.Fatalf("pending join %+v", j)
	}
	if c := codeUses(t, l, code.ID); c.Uses != 1 || c.Registrations != 0 {
		t.Fatalf("code while pending: uses %d, registrations %d", c.Uses, c.Registrations)
	}
	if nodes, _ := l.Admin.Nodes(context.Background()); len(nodes) != 0 {
		t.Fatalf("%d nodes before approval", len(nodes))
	}

	decide(t, l, joinID, true)
	joined, err := b.wait(t)
	if err != nil {
		t.Fatalf("approved join: %v", err)
	}
	n, err := l.Admin.Node(context.Background(), joined.Identity.NodeID)
	if err != nil || n.JoinID != joinID || n.Facts.Hostname != "gpu-07" {
		t.Fatalf("node %+v %v", n, err)
	}
	if j := findJoin(t, l, joinID); j.NodeID != joined.Identity.NodeID || j.IsPending() {
		t.Fatalf("join after approval %+v", j)
	}
	if c := codeUses(t, l, code.ID); c.Uses != 1 || c.Registrations != 1 {
		t.Fatalf("code after approval: uses %d, registrations %d", c.Uses, c.Registrations)
	}
	if _, err := pki.VerifyNodeChain([][]byte{joined.Chain[0].Raw}, l.Roots(), l.Settings().TrustDomain, time.Now()); err != nil {
		t.Fatalf("certificate: %v", err)
	}
}

// TestApprovalRefused: a refused join ends with JOIN_APPROVAL_REFUSED, a
// permanent refusal, and stays refused when the same key comes back.
func TestApprovalRefused(t *testing.T) {
	l := listenertest.Start(t, listenertest.Options{})
	sec, code := mint(t, l, adminapi.MintCodeRequest{MaxUses: uses(3)})
	dir := filepath.Join(t.TempDir(), "state")
	b := startJoin(t, l, sec, dir, wire.Facts{})
	decide(t, l, b.waitPending(t), false)
	_, err := b.wait(t)
	var refused *agent.RefusedError
	if !errors.As(err, &refused) || refused.Code != wire.CodeApprovalRefused || refused.Retryable() {
		t.Fatalf("refused join: %v, want a permanent %s", err, wire.CodeApprovalRefused)
	}
	again := startJoin(t, l, sec, dir, wire.Facts{})
	if _, err := again.wait(t); !errors.As(err, &refused) || refused.Code != wire.CodeApprovalRefused {
		t.Fatalf("same key after the refusal: %v", err)
	}
	if len(again.pending) != 0 {
		t.Fatal("a refused join was announced as pending again")
	}
	if c := codeUses(t, l, code.ID); c.Uses != 1 || c.Registrations != 0 {
		t.Fatalf("code: uses %d, registrations %d", c.Uses, c.Registrations)
	}
	if nodes, _ := l.Admin.Nodes(context.Background()); len(nodes) != 0 {
		t.Fatalf("%d nodes after a refusal", len(nodes))
	}
}

// TestApprovalResumesAfterDroppedConnection: the agent that lost its
// connection while pending comes back with the same key and finds its
// join, announced again, without a second use; the code's only use is the
// one it holds, so the code is no longer live, and the join goes on.
func TestApprovalResumesAfterDroppedConnection(t *testing.T) {
	l := listenertest.Start(t, listenertest.Options{})
	sec, code := mint(t, l, adminapi.MintCodeRequest{MaxUses: uses(1)})
	dir := filepath.Join(t.TempDir(), "state")
	first := startJoin(t, l, sec, dir, wire.Facts{Hostname: "n1"})
	joinID := first.waitPending(t)
	first.drop(t)

	second := startJoin(t, l, sec, dir, wire.Facts{Hostname: "n1"})
	if again := second.waitPending(t); again != joinID {
		t.Fatalf("reconnect is pending as %s, first as %s", again, joinID)
	}
	js, _ := l.Admin.Joins(context.Background())
	if c := codeUses(t, l, code.ID); len(js) != 1 || c.Uses != 1 {
		t.Fatalf("after the reconnect: %d joins, code uses %d", len(js), c.Uses)
	}
	decide(t, l, joinID, true)
	joined, err := second.wait(t)
	if err != nil {
		t.Fatalf("resumed join: %v", err)
	}
	if c := codeUses(t, l, code.ID); c.Uses != 1 || c.Registrations != 1 || joined.Identity.NodeID == "" {
		t.Fatalf("code after the resumed join: %+v", c)
	}
}

// TestApprovalBelongsToTheKey: an approval completes only the join of the
// key that made it. Another key with the same code, arriving after the
// approval and before the first key comes back, gets its own pending join;
// with no use left it is refused outright.
func TestApprovalBelongsToTheKey(t *testing.T) {
	l := listenertest.Start(t, listenertest.Options{})
	sec, code := mint(t, l, adminapi.MintCodeRequest{MaxUses: uses(2)})
	dirA, dirB := filepath.Join(t.TempDir(), "a"), filepath.Join(t.TempDir(), "b")
	a := startJoin(t, l, sec, dirA, wire.Facts{Hostname: "a"})
	joinA := a.waitPending(t)
	a.drop(t)
	decide(t, l, joinA, true) // approved while its agent is away

	b := startJoin(t, l, sec, dirB, wire.Facts{Hostname: "b"})
	joinB := b.waitPending(t)
	if joinB == joinA {
		t.Fatal("a second key was handed the first key's approved join")
	}
	if j := findJoin(t, l, joinB); !j.IsPending() || j.KeyFP != keyFingerprint(t, dirB) {
		t.Fatalf("second key's join %+v", j)
	}

	back := startJoin(t, l, sec, dirA, wire.Facts{Hostname: "a"})
	joined, err := back.wait(t)
	if err != nil || len(back.pending) != 0 {
		t.Fatalf("first key back after its approval: %v (pending announced: %d)", err, len(back.pending))
	}
	decide(t, l, joinB, false)
	var refused *agent.RefusedError
	if _, err := b.wait(t); !errors.As(err, &refused) || refused.Code != wire.CodeApprovalRefused {
		t.Fatalf("second key after its refusal: %v", err)
	}
	nodes, _ := l.Admin.Nodes(context.Background())
	if len(nodes) != 1 || nodes[0].ID != joined.Identity.NodeID {
		t.Fatalf("nodes %+v", nodes)
	}
	if c := codeUses(t, l, code.ID); c.Uses != 2 || c.Registrations != 1 {
		t.Fatalf("code: uses %d, registrations %d", c.Uses, c.Registrations)
	}

	// One use: after the first key's join is approved, another key finds
	// the code used up.
	sec1, _ := mint(t, l, adminapi.MintCodeRequest{MaxUses: uses(1)})
	c := startJoin(t, l, sec1, filepath.Join(t.TempDir(), "c"), wire.Facts{})
	decide(t, l, c.waitPending(t), true)
	if _, err := c.wait(t); err != nil {
		t.Fatal(err)
	}
	d := startJoin(t, l, sec1, filepath.Join(t.TempDir(), "d"), wire.Facts{})
	if _, err := d.wait(t); !errors.As(err, &refused) || refused.Code != wire.CodeUsedUp {
		t.Fatalf("another key on a used-up approval code: %v", err)
	}
}

// TestLostResultResumesWithoutSecondUse: the listener committed a join
// whose Result never reached the agent; the agent, coming back with the
// same key, gets the same node and a certificate without a second use.
func TestLostResultResumesWithoutSecondUse(t *testing.T) {
	l := listenertest.Start(t, listenertest.Options{})
	sec, code := mint(t, l, adminapi.MintCodeRequest{AutoApprove: true, MaxUses: uses(1)})
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := agent.CSR(key)
	if err != nil {
		t.Fatal(err)
	}
	// The Result is read here only to learn the node id; the agent's
	// state directory never sees it.
	out, err := rawJoin{Secret: sec, CSR: csr}.run(context.Background(), l.Endpoint)
	if err != nil || len(out.Results) != 1 || out.Results[0].Status != wire.StatusJoined {
		t.Fatalf("raw join: %v %+v", err, out.Results)
	}
	lostNode := out.Results[0].NodeID

	dir := filepath.Join(t.TempDir(), "state")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	keyPEM, err := pki.MarshalPrivateKeyPEM(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := pki.WriteSecretFile(filepath.Join(dir, agent.KeyFile), keyPEM); err != nil {
		t.Fatal(err)
	}
	j, err := agent.Join(context.Background(), agent.JoinConfig{StateDir: dir, Endpoint: l.Endpoint, Secret: sec})
	if err != nil {
		t.Fatalf("join again with the same key: %v", err)
	}
	if j.Identity.NodeID != lostNode {
		t.Fatalf("resumed as %s, the lost Result named %s", j.Identity.NodeID, lostNode)
	}
	if c := codeUses(t, l, code.ID); c.Uses != 1 || c.Registrations != 1 {
		t.Fatalf("code: uses %d, registrations %d", c.Uses, c.Registrations)
	}
	// any other key finds the code used up
	_, _, err = join(t, l, sec, wire.Facts{})
	var refused *agent.RefusedError
	if !errors.As(err, &refused) || refused.Code != wire.CodeUsedUp {
		t.Fatalf("another key: %v", err)
	}
}

// TestApprovalOutlivesCodeExpiry: an administrator who approves after the
// code expired still completes the join proven while it was live; a new
// join with the expired code is refused.
func TestApprovalOutlivesCodeExpiry(t *testing.T) {
	clock := newFakeNow()
	l := listenertest.Start(t, listenertest.Options{Config: listener.Config{Now: clock.Now}})
	sec, _ := mint(t, l, adminapi.MintCodeRequest{TTLSeconds: 60, MaxUses: uses(5)})
	b := startJoinAt(t, l, sec, filepath.Join(t.TempDir(), "state"), wire.Facts{}, clock.Now)
	joinID := b.waitPending(t)
	clock.Advance(2 * time.Minute)
	decide(t, l, joinID, true)
	if _, err := b.wait(t); err != nil {
		t.Fatalf("join approved after its code expired: %v", err)
	}
	_, err := startJoinAt(t, l, sec, filepath.Join(t.TempDir(), "other"), wire.Facts{}, clock.Now).wait(t)
	var refused *agent.RefusedError
	if !errors.As(err, &refused) || refused.Code != wire.CodeExpired {
		t.Fatalf("new join with the expired code: %v", err)
	}
}

// TestApprovalKeepsApprovedFacts: the node gets the facts the
// administrator saw, not different ones claimed on a reconnect.
func TestApprovalKeepsApprovedFacts(t *testing.T) {
	l := listenertest.Start(t, listenertest.Options{})
	sec, _ := mint(t, l, adminapi.MintCodeRequest{})
	dir := filepath.Join(t.TempDir(), "state")
	a := startJoin(t, l, sec, dir, wire.Facts{Hostname: "approved-host", Serial: "SN-1"})
	joinID := a.waitPending(t)
	a.drop(t)
	decide(t, l, joinID, true)
	back := startJoin(t, l, sec, dir, wire.Facts{Hostname: "other-host", Serial: "SN-2"})
	joined, err := back.wait(t)
	if err != nil {
		t.Fatal(err)
	}
	n, err := l.Admin.Node(context.Background(), joined.Identity.NodeID)
	if err != nil || n.Facts.Hostname != "approved-host" || n.Facts.Serial != "SN-1" {
		t.Fatalf("node facts %+v (%v), want the approved ones", n.Facts, err)
	}
}
