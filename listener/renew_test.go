package listener_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/x509"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stratumjoin/stratum/agent"
	"github.com/stratumjoin/stratum/internal/wire"
	"github.com/stratumjoin/stratum/listener"
	"github.com/stratumjoin/stratum/listener/adminapi"
	"github.com/stratumjoin/stratum/listener/listenertest"
	"github.com/stratumjoin/stratum/pki"
	"github.com/stratumjoin/stratum/pki/authority"
)

// fakeNow is a clock that moves only when the test says.
type fakeNow struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeNow() *fakeNow { return &fakeNow{t: time.Now().UTC().Truncate(time.Second)} }

func (c *fakeNow) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeNow) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// renewFixture is a listener on a fake clock and one node joined to it.
type renewFixture struct {
	clock *fakeNow
	l     *listenertest.Listener
	dir   string
	id    agent.Identity
	code  adminapi.Code
}

func joinedNode(t *testing.T, facts wire.Facts) *renewFixture {
	t.Helper()
	f := &renewFixture{clock: newFakeNow(), dir: filepath.Join(t.TempDir(), "state")}
	f.l = listenertest.Start(t, listenertest.Options{Init: listener.InitConfig{Now: f.clock.Now()}, Config: listener.Config{Now: f.clock.Now}})
	sec, code := mint(t, f.l, adminapi.MintCodeRequest{AutoApprove: true})
	f.code = code
	j, err := agent.Join(context.Background(), agent.JoinConfig{StateDir: f.dir, Endpoint: f.l.Endpoint, Secret: sec, Facts: facts, Now: f.clock.Now})
	if err != nil {
		t.Fatalf("join: %v", err)
	}
	f.id = j.Identity
	return f
}

// writeIdentity overwrites node.json.
func writeIdentity(t *testing.T, dir string, id agent.Identity) {
	t.Helper()
	b, err := json.Marshal(id)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, agent.NodeFile), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func (f *renewFixture) renew() (agent.Identity, error) {
	return agent.Renew(context.Background(), agent.RenewConfig{StateDir: f.dir, Now: f.clock.Now})
}

func (f *renewFixture) leaf(t *testing.T) *x509.Certificate {
	t.Helper()
	chain, err := agent.State{Dir: f.dir}.Chain()
	if err != nil {
		t.Fatal(err)
	}
	return chain[0]
}

func pinned(t *testing.T, dir string) []string {
	t.Helper()
	roots, err := agent.State{Dir: dir}.Roots()
	if err != nil {
		t.Fatal(err)
	}
	var fps []string
	for _, r := range roots {
		fps = append(fps, pki.FormatFingerprint(pki.FingerprintOf(r)))
	}
	return fps
}

// TestRenewIssuesFreshCertificate: a renewal over stratum-node/1 gives the
// same node, key and pinned CA a new certificate valid a full life from now.
func TestRenewIssuesFreshCertificate(t *testing.T) {
	f := joinedNode(t, wire.Facts{})
	old := f.leaf(t)
	f.clock.Advance(5 * 24 * time.Hour)
	id, err := f.renew()
	if err != nil {
		t.Fatalf("renew: %v", err)
	}
	leaf := f.leaf(t)
	if id.NodeID != f.id.NodeID || leaf.SerialNumber.Cmp(old.SerialNumber) == 0 || !leaf.PublicKey.(*ecdsa.PublicKey).Equal(old.PublicKey) {
		t.Fatalf("renewed: node %s serial %x (old %x)", id.NodeID, leaf.SerialNumber, old.SerialNumber)
	}
	if want := f.clock.Now().Add(7 * 24 * time.Hour); !id.NotAfter.Equal(leaf.NotAfter) || id.NotAfter.Before(want.Add(-time.Second)) {
		t.Fatalf("renewed certificate valid until %s, want %s", id.NotAfter, want)
	}
	if id.LastRenewal == nil || !id.LastRenewal.Equal(f.clock.Now()) || id.CAFingerprint != f.id.CAFingerprint {
		t.Fatalf("identity after renewal %+v", id)
	}
	n, err := f.l.Admin.Node(context.Background(), id.NodeID)
	if err != nil || n.RenewedAt == nil || !n.NotAfter.Equal(leaf.NotAfter) {
		t.Fatalf("node record %+v %v", n, err)
	}
}

// TestRenewAcceptsCertificateThatExpired: a machine that was off past its
// certificate's expiry renews with it while the listener knows the node.
func TestRenewAcceptsCertificateThatExpiredWithinGrace(t *testing.T) {
	f := joinedNode(t, wire.Facts{})
	// the default grace is 96h: a machine off over a long weekend
	f.clock.Advance(f.id.NotAfter.Sub(f.clock.Now()) + 96*time.Hour - time.Minute)
	id, err := f.renew()
	if err != nil {
		t.Fatalf("renew with a certificate expired just under 96h ago: %v", err)
	}
	if !id.NotAfter.After(f.clock.Now()) || id.NodeID != f.id.NodeID {
		t.Fatalf("renewed %+v", id)
	}
}

// TestRenewRefusesCertificateExpiredBeyondGrace: a certificate that
// expired longer ago than the grace is refused NODE_CERT_EXPIRED, saying
// the node needs a new code, and the node record is left as it was.
func TestRenewRefusesCertificateExpiredBeyondGrace(t *testing.T) {
	f := joinedNode(t, wire.Facts{})
	f.clock.Advance(f.id.NotAfter.Sub(f.clock.Now()) + 96*time.Hour + time.Minute)
	_, err := f.renew()
	var refused *agent.RefusedError
	if !errors.As(err, &refused) || refused.Code != wire.CodeCertExpired || !strings.Contains(refused.Message, "new code") {
		t.Fatalf("renew past the grace: %v, want NODE_CERT_EXPIRED asking for a new code", err)
	}
	n, err := f.l.Admin.Node(context.Background(), f.id.NodeID)
	if err != nil || n.RenewedAt != nil || !n.NotAfter.Equal(f.id.NotAfter) {
		t.Fatalf("node record after a refused renewal: %+v %v", n, err)
	}
}

// TestRenewRefusesRevokedNode: `nodes revoke` makes renewals fail with a
// permanent NODE_REVOKED, and nothing is written.
func TestRenewRefusesRevokedNode(t *testing.T) {
	f := joinedNode(t, wire.Facts{})
	if _, err := f.l.Admin.RevokeNode(context.Background(), f.id.NodeID); err != nil {
		t.Fatal(err)
	}
	old := f.leaf(t)
	_, err := f.renew()
	var refused *agent.RefusedError
	if !errors.As(err, &refused) || refused.Code != wire.CodeNodeRevoked || refused.Retryable() {
		t.Fatalf("renew of a revoked node: %v, want a permanent %s", err, wire.CodeNodeRevoked)
	}
	if !f.leaf(t).Equal(old) {
		t.Fatal("node.crt changed after a refused renewal")
	}
}

// TestRenewRefusesReclaimedCertificate: once another machine reclaimed the
// node id (same identity, a code with allowReclaim), the old certificate
// no longer renews.
func TestRenewRefusesReclaimedCertificate(t *testing.T) {
	facts := wire.Facts{ProductUUID: "4C4C4544-0042-3510-8051-B7C04F4E3732"}
	f := joinedNode(t, facts)
	sec, _ := mint(t, f.l, adminapi.MintCodeRequest{AutoApprove: true, AllowReclaim: true})
	j, err := agent.Join(context.Background(), agent.JoinConfig{StateDir: filepath.Join(t.TempDir(), "new"), Endpoint: f.l.Endpoint, Secret: sec, Facts: facts, Now: f.clock.Now})
	if err != nil || j.Identity.NodeID != f.id.NodeID {
		t.Fatalf("reclaim: %v", err)
	}
	_, err = f.renew()
	var refused *agent.RefusedError
	if !errors.As(err, &refused) || refused.Code != wire.CodeNodeRevoked {
		t.Fatalf("renew with the reclaimed certificate: %v", err)
	}
}

// TestRenewRefusesUnknownNode: a listener that lost its store (same CA)
// answers NODE_UNKNOWN.
func TestRenewRefusesUnknownNode(t *testing.T) {
	f := joinedNode(t, wire.Facts{})
	f.l.Stop()
	pc, err := net.ListenPacket("udp", f.l.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	listenertest.Start(t, listenertest.Options{DataDir: f.l.DataDir, Config: listener.Config{
		Now: f.clock.Now, PacketConn: pc, StoreURL: "bolt:" + filepath.Join(t.TempDir(), "empty.db"),
	}})
	_, err = f.renew()
	var refused *agent.RefusedError
	if !errors.As(err, &refused) || refused.Code != wire.CodeNodeUnknown || refused.Retryable() {
		t.Fatalf("renew against a listener that forgot the node: %v", err)
	}
}

// TestRenewRefusesForeignCertificate: a node certificate of another
// cluster (same trust domain) gets nothing from this listener.
func TestRenewRefusesForeignCertificate(t *testing.T) {
	f := joinedNode(t, wire.Facts{})
	other := listenertest.Start(t, listenertest.Options{Config: listener.Config{Now: f.clock.Now}})
	// The node trusts the other listener (its pin and endpoint point
	// there) but its certificate is this cluster's.
	id := f.id
	id.Endpoint = other.Endpoint
	roots := other.Roots()
	if err := os.WriteFile(filepath.Join(f.dir, agent.CAFile), pki.EncodeCertsPEM(roots), 0o644); err != nil {
		t.Fatal(err)
	}
	writeIdentity(t, f.dir, id)
	old := f.leaf(t)
	_, err := f.renew()
	var refused *agent.RefusedError
	if !errors.As(err, &refused) || refused.Code != wire.CodeCertInvalid || refused.Retryable() {
		t.Fatalf("another cluster's certificate: %v, want a permanent %s refusal", err, wire.CodeCertInvalid)
	}
	if nodes, _ := other.Admin.Nodes(context.Background()); len(nodes) != 0 || !f.leaf(t).Equal(old) {
		t.Fatalf("foreign renewal left %d nodes", len(nodes))
	}
}

// TestRenewAcrossCARotation: after `ca rotate` a node that pinned only the
// old root renews (the listener's chain carries the cross certificate),
// gets a certificate of the new root and pins the bundle of both; once the
// old root is gone from the cluster's bundle, it pins the new one alone.
func TestRenewAcrossCARotation(t *testing.T) {
	f := joinedNode(t, wire.Facts{})
	oldFP := f.id.CAFingerprint
	ca, err := f.l.Admin.RotateCA(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	f.clock.Advance(5 * 24 * time.Hour)
	id, err := f.renew()
	if err != nil {
		t.Fatalf("renew after rotation: %v", err)
	}
	if id.CAFingerprint != ca.Fingerprint {
		t.Fatalf("pinned CA after rotation %s, want the new root %s", id.CAFingerprint, ca.Fingerprint)
	}
	if got := pinned(t, f.dir); !slices.Equal(got, []string{ca.Fingerprint, oldFP}) {
		t.Fatalf("ca.pem holds %v, want the new root then the old", got)
	}
	newRoot := f.l.Roots()[0]
	if _, err := pki.VerifyNodeChain([][]byte{f.leaf(t).Raw}, []*x509.Certificate{newRoot}, "stratum.local", f.clock.Now()); err != nil {
		t.Fatalf("renewed certificate under the new root alone: %v", err)
	}

	// Retire the old root: the cluster's bundle holds only the new one.
	f.l.Stop()
	if err := pki.WriteFile(filepath.Join(f.l.DataDir, "keys", authority.RootsFile), pki.EncodeCertsPEM([]*x509.Certificate{newRoot}), 0o600); err != nil {
		t.Fatal(err)
	}
	pc, err := net.ListenPacket("udp", f.l.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	restarted := listenertest.Start(t, listenertest.Options{DataDir: f.l.DataDir, Config: listener.Config{Now: f.clock.Now, PacketConn: pc}})
	f.clock.Advance(5 * 24 * time.Hour)
	id, err = f.renew()
	if err != nil {
		t.Fatalf("renew after the old root is gone: %v", err)
	}
	if got := pinned(t, f.dir); !slices.Equal(got, []string{ca.Fingerprint}) || id.CAFingerprint != ca.Fingerprint {
		t.Fatalf("pinned %v (%s) once the old root is gone, want the new root %s alone", got, id.CAFingerprint, ca.Fingerprint)
	}
	c, _ := restarted.Admin.Code(context.Background(), f.code.ID)
	if id.NodeID != f.id.NodeID || c.Uses != 1 {
		t.Fatalf("node %s after two renewals (was %s), code uses %d", id.NodeID, f.id.NodeID, c.Uses)
	}
}
