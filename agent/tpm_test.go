package agent_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/x509"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stratumjoin/stratum/agent"
	"github.com/stratumjoin/stratum/internal/cluster"
	"github.com/stratumjoin/stratum/internal/tpm"
	"github.com/stratumjoin/stratum/internal/tpm/swtpmtest"
	"github.com/stratumjoin/stratum/internal/wire"
	"github.com/stratumjoin/stratum/listener"
	"github.com/stratumjoin/stratum/listener/adminapi"
	"github.com/stratumjoin/stratum/listener/listenertest"
	"github.com/stratumjoin/stratum/listener/registry"
)

// tpmPublic reads the node key's public key back from the TPM.
func tpmPublic(t *testing.T, sim *swtpmtest.Sim, dir string) *ecdsa.PublicKey {
	t.Helper()
	blobs, err := agent.State{Dir: dir}.TPMBlobs()
	if err != nil {
		t.Fatal(err)
	}
	tp := sim.Open()
	defer tp.Close()
	pub, err := tp.ReadPublic(blobs)
	if err != nil {
		t.Fatal(err)
	}
	return pub
}

func leafOf(t *testing.T, dir string) *x509.Certificate {
	t.Helper()
	chain, err := agent.State{Dir: dir}.Chain()
	if err != nil {
		t.Fatal(err)
	}
	return chain[0]
}

// TestTPMJoinAndRenew: the node key is made in swtpm and never written to
// disk; the certificate verifies and is for the key the TPM holds; renewal
// is signed in the TPM after a power cycle; the blobs are useless in
// another TPM and after a clear.
func TestTPMJoinAndRenew(t *testing.T) {
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Fatal("openssl is not installed: apt-get install openssl")
	}
	sim := swtpmtest.Start(t)
	maker := swtpmtest.NewCA(t, "Test TPM Maker")
	sim.Provision(maker)
	ekHash := sim.EKHash()
	l := listenertest.Start(t, listenertest.Options{Config: listener.Config{TPMRoots: []*x509.Certificate{maker.Cert}}})
	sec, _ := mintCode(t, l, adminapi.MintCodeRequest{AutoApprove: true})
	dir := filepath.Join(t.TempDir(), "state")
	ctx := context.Background()

	j, err := agent.Join(ctx, agent.JoinConfig{StateDir: dir, Endpoint: l.Endpoint, Secret: sec, TPM: sim.Locator()})
	if err != nil {
		t.Fatalf("join through swtpm: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, agent.KeyFile)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s exists after a TPM join (%v)", agent.KeyFile, err)
	}
	for _, f := range []string{agent.TPMPublicFile, agent.TPMPrivateFile} {
		st, err := os.Stat(filepath.Join(dir, f))
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v, mode %v; want a 0600 file", f, err, st.Mode())
		}
	}
	out, err := exec.Command("openssl", "verify", "-CAfile", filepath.Join(dir, agent.CAFile), "-untrusted", filepath.Join(dir, agent.CertFile), filepath.Join(dir, agent.CertFile)).CombinedOutput()
	if err != nil || !strings.Contains(string(out), ": OK") {
		t.Fatalf("openssl verify: %v\n%s", err, out)
	}
	if !tpmPublic(t, sim, dir).Equal(leafOf(t, dir).PublicKey) {
		t.Fatal("the node certificate is not for the key the TPM holds")
	}
	n, err := l.Admin.Node(ctx, j.Identity.NodeID)
	if err != nil {
		t.Fatal(err)
	}
	if n.Attested == nil || n.Attested.EKHash != ekHash || !n.Attested.EKCertVerified || !n.Attested.KeyInTPM || n.IdentityKey != "ek:"+ekHash {
		t.Fatalf("node %+v attested %+v, want EK %s verified", n.Node, n.Attested, ekHash)
	}

	// power cycle: nothing is loaded any more, the renewal loads the key
	// from its blobs and signs the handshake and the CSR in the TPM
	before := leafOf(t, dir)
	sim.Restart()
	id, err := agent.Renew(ctx, agent.RenewConfig{StateDir: dir, TPM: sim.Locator()})
	if err != nil {
		t.Fatalf("renew after a TPM power cycle: %v", err)
	}
	if id.LastRenewal == nil || leafOf(t, dir).Equal(before) {
		t.Fatalf("renewal not recorded: %+v", id)
	}
	if !tpmPublic(t, sim, dir).Equal(leafOf(t, dir).PublicKey) {
		t.Fatal("the renewed certificate is not for the TPM's key")
	}
	if _, err := os.Stat(filepath.Join(dir, agent.KeyFile)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s exists after a TPM renewal (%v)", agent.KeyFile, err)
	}

	// the blobs copied next to another TPM load nowhere
	other := swtpmtest.Start(t)
	copyDir := filepath.Join(t.TempDir(), "copy")
	if err := os.CopyFS(copyDir, os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}
	_, err = agent.Renew(ctx, agent.RenewConfig{StateDir: copyDir, TPM: other.Locator()})
	if !errors.Is(err, tpm.ErrKeyNotLoadable) {
		t.Fatalf("renew with the blobs in another TPM: %v, want the key not loadable", err)
	}

	// a cleared TPM: the renewal fails with a sentence that says so
	sim.Clear()
	_, err = agent.Renew(ctx, agent.RenewConfig{StateDir: dir, TPM: sim.Locator()})
	if !errors.Is(err, tpm.ErrKeyNotLoadable) || !strings.Contains(err.Error(), "cleared") || !strings.Contains(err.Error(), "join again") {
		t.Fatalf("renew after TPM2_Clear: %v", err)
	}
}

// TestTPMExpectAndPolicy: a code pinned to another TPM's EK is refused and
// keeps its uses; a requireTPM pool refuses an agent without a TPM.
func TestTPMExpectAndPolicy(t *testing.T) {
	a, b := swtpmtest.Start(t), swtpmtest.Start(t)
	reg, err := registry.Parse([]byte(`
tenants: [{id: acme}]
sites: [{id: dc, owner: platform}]
pools:
  - {id: sealed, tenant: acme, site: dc, agent: bcd, policy: {requireTPM: true}}
  - {id: open, tenant: acme, site: dc, agent: bcd}
`))
	if err != nil {
		t.Fatal(err)
	}
	l := listenertest.Start(t, listenertest.Options{Config: listener.Config{Registry: reg}})
	ctx := context.Background()

	sec, code := mintCode(t, l, adminapi.MintCodeRequest{AutoApprove: true, Pool: "open", Expect: &cluster.Expect{EKHash: b.EKHash()}})
	_, err = agent.Join(ctx, agent.JoinConfig{StateDir: t.TempDir(), Endpoint: l.Endpoint, Secret: sec, TPM: a.Locator()})
	var r *agent.RefusedError
	if !errors.As(err, &r) || r.Code != wire.CodeIdentityMismatch {
		t.Fatalf("TPM A on a code pinned to TPM B: %v", err)
	}
	if got, err := l.Admin.Code(ctx, code.ID); err != nil || got.Uses != 0 {
		t.Fatalf("uses after the mismatch: %+v, %v", got, err)
	}
	if _, err := agent.Join(ctx, agent.JoinConfig{StateDir: t.TempDir(), Endpoint: l.Endpoint, Secret: sec, TPM: b.Locator()}); err != nil {
		t.Fatalf("TPM B on its own pin: %v", err)
	}

	sec, code = mintCode(t, l, adminapi.MintCodeRequest{AutoApprove: true, Pool: "sealed"})
	_, err = agent.Join(ctx, agent.JoinConfig{StateDir: t.TempDir(), Endpoint: l.Endpoint, Secret: sec})
	if !errors.As(err, &r) || r.Code != wire.CodeTPMRequired {
		t.Fatalf("no TPM in a requireTPM pool: %v", err)
	}
	if got, err := l.Admin.Code(ctx, code.ID); err != nil || got.Uses != 0 {
		t.Fatalf("uses after the refusal: %+v, %v", got, err)
	}
	if _, err := agent.Join(ctx, agent.JoinConfig{StateDir: t.TempDir(), Endpoint: l.Endpoint, Secret: sec, TPM: a.Locator()}); err != nil {
		t.Fatalf("a TPM in a requireTPM pool: %v", err)
	}
}

// TestTPMRunStopsWhenTPMCleared: the service joins through the TPM; the TPM
// is cleared; at renewal time the service stops with a sentence that says
// what happened and what to do, and records it for `status`.
func TestTPMRunStopsWhenTPMCleared(t *testing.T) {
	sim := swtpmtest.Start(t)
	clock := newFakeClock()
	l := fakeTimeListener(t, clock)
	sec, _ := mintCode(t, l, adminapi.MintCodeRequest{AutoApprove: true})
	a := startAgent(t, l.Endpoint, sec, filepath.Join(t.TempDir(), "state"), clock, func(c *agent.RunConfig) { c.TPM = sim.Locator() })
	a.waitReady(t, 30*time.Second)
	id := a.identity(t)
	if id.TPM != sim.Locator() {
		t.Fatalf("node.json tpm %q", id.TPM)
	}
	sim.Clear()
	clock.waitWaiters(t, 1)
	clock.Advance(id.NotAfter.Sub(clock.Now()) * 4 / 5)
	err := a.result(t, 30*time.Second)
	if !errors.Is(err, tpm.ErrKeyNotLoadable) {
		t.Fatalf("Run returned %v, want the key not loadable", err)
	}
	if last := a.notes.last(); !strings.HasPrefix(last, "STATUS failed: ") || !strings.Contains(last, "cleared") {
		t.Fatalf("last status %q", last)
	}
	if got := a.identity(t); !strings.Contains(got.LastError, "join again with a new code") {
		t.Fatalf("node.json after the failure: %+v", got)
	}
}
