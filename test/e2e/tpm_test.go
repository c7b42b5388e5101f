package e2e

import (
	"context"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stratumjoin/stratum/internal/tpm/swtpmtest"
)

// TestTPMCLI runs the binaries against two swtpm: `tpm ek` prints the hash
// `codes create --expect-ek` pins; a code pinned to another TPM is refused
// with its use kept; a join through a TPM writes no node.key and `nodes
// show` lists the EK as attested, its certificate checked against
// `serve --tpm-ca-dir`; a TPM without an EK certificate is refused there.
func TestTPMCLI(t *testing.T) {
	a, b := swtpmtest.Start(t), swtpmtest.Start(t)
	maker := swtpmtest.NewCA(t, "Test TPM Maker")
	a.Provision(maker)
	caDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(caDir, "maker.pem"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: maker.Cert.Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	l := newListener(t)
	l.stop()
	l.serveArgs = []string{"--tpm-ca-dir", caDir}
	l.start()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// the first line is the hash (B's note on its missing certificate follows)
	hashA := strings.Fields(string(run(t, nil, "stratum-agent", "tpm", "ek", "--tpm-sim", a.Addr())))[0]
	hashB := strings.Fields(string(run(t, nil, "stratum-agent", "tpm", "ek", "--tpm-sim", b.Addr())))[0]
	if hashA != a.EKHash() || hashB == hashA || len(hashB) != 64 {
		t.Fatalf("tpm ek: %q and %q", hashA, hashB)
	}

	var pinned mintedCode
	l.adminJSON(&pinned, "codes", "create", "--auto-approve", "--max-uses", "1", "--expect-ek", hashB)
	state := filepath.Join(t.TempDir(), "a")
	r := agentJoin(ctx, l.endpoint, pinned.Code, state, "--tpm-sim", a.Addr())
	if r.exit != 1 || !strings.Contains(r.stderr, "TPM is not the one the join code is pinned to") {
		t.Fatalf("TPM A on a code pinned to B: exit %d\n%s", r.exit, r.stderr)
	}
	var after mintedCode
	l.adminJSON(&after, "codes", "show", pinned.ID)
	if after.Uses != 0 || after.State != "live" {
		t.Fatalf("the pinned code after the mismatch: %+v", after)
	}

	var open mintedCode
	l.adminJSON(&open, "codes", "create", "--auto-approve", "--max-uses", "2")
	r = agentJoin(ctx, l.endpoint, open.Code, state, "--tpm-sim", a.Addr(), "--json")
	if r.exit != 0 {
		t.Fatalf("join through TPM A: exit %d\n%s", r.exit, r.stderr)
	}
	if _, err := os.Stat(filepath.Join(state, "node.key")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("node.key after a TPM join: %v", err)
	}
	status := string(run(t, nil, "stratum-agent", "status", "--state", state))
	if !strings.Contains(status, "node key     in the TPM sim:"+a.Addr()) {
		t.Fatalf("status:\n%s", status)
	}
	var nodes struct {
		Items []struct {
			ID string `json:"id"`
		} `json:"items"`
	}
	l.adminJSON(&nodes, "nodes", "list")
	if len(nodes.Items) != 1 {
		t.Fatalf("nodes: %+v", nodes)
	}
	id := nodes.Items[0].ID
	show, err := l.admin("nodes", "show", id)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"attested by its TPM", hashA, "EK certificate verified, issued by", "claimed by the machine at join, not attested"} {
		if !strings.Contains(string(show), want) {
			t.Fatalf("nodes show lacks %q:\n%s", want, show)
		}
	}

	// B has no EK certificate: this listener takes only manufacturer-rooted TPMs
	r = agentJoin(ctx, l.endpoint, open.Code, filepath.Join(t.TempDir(), "b"), "--tpm-sim", b.Addr())
	if r.exit != 1 || !strings.Contains(r.stderr, "no EK certificate") {
		t.Fatalf("TPM B without an EK certificate: exit %d\n%s", r.exit, r.stderr)
	}
}
