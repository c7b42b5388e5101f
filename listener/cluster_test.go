package listener_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stratumjoin/stratum/agent"
	"github.com/stratumjoin/stratum/internal/pake"
	"github.com/stratumjoin/stratum/internal/secretscan"
	"github.com/stratumjoin/stratum/internal/store"
	"github.com/stratumjoin/stratum/internal/store/boltstore"
	"github.com/stratumjoin/stratum/internal/wire"
	"github.com/stratumjoin/stratum/listener"
	"github.com/stratumjoin/stratum/listener/adminapi"
	"github.com/stratumjoin/stratum/listener/listenertest"
	"github.com/stratumjoin/stratum/pki"
	"github.com/stratumjoin/stratum/pki/authority"
)

// waitFor polls cond until it holds or the (generous) deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > 30*time.Second {
			t.Fatalf("%s: not after 30s", what)
		}
		time.Sleep(10 * time.Millisecond) // polling for cond
	}
	return time.Since(start)
}

// TestListenersShareSealedKeys: three listeners of one store (bbolt, whose
// watch is in-process) are one cluster: a second init is refused, init
// --join takes the cluster's keys, a code joins through another listener,
// a rotation on one is served by the others, and a listener with keys of
// its own refuses to serve.
func TestListenersShareSealedKeys(t *testing.T) {
	ctx := context.Background()
	st, err := boltstore.Open(filepath.Join(t.TempDir(), "shared.db"), boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	a := listenertest.Start(t, listenertest.Options{Init: listener.InitConfig{Store: st}, Config: listener.Config{Store: st}})
	kek := filepath.Join(a.DataDir, "keys", listener.KEKFile)

	var exists *listener.ClusterExistsError
	_, err = listener.Init(ctx, listener.InitConfig{DataDir: filepath.Join(t.TempDir(), "second"), Store: st, KSF: pake.LightestKSF})
	if !errors.As(err, &exists) {
		t.Fatalf("a second init on the store: %v", err)
	}
	_, fp := a.CA()
	if exists.CAFingerprint != fp {
		t.Fatalf("the refusal names %s, the cluster is %s", exists.CAFingerprint, fp)
	}

	b := listenertest.Start(t, listenertest.Options{Init: listener.InitConfig{Store: st, Join: true, KEKFile: kek}, Config: listener.Config{Store: st}})
	if _, bfp := b.CA(); bfp != fp {
		t.Fatalf("init --join: CA %s, the cluster's is %s", bfp, fp)
	}
	sec, code := mint(t, a, adminapi.MintCodeRequest{AutoApprove: true})
	if _, _, err := join(t, b, sec, wire.Facts{}); err != nil {
		t.Fatalf("a code minted on A through B: %v", err)
	}
	if !strings.Contains(code.AgentCommand, "--endpoint "+a.Endpoint) || strings.Count(code.AgentCommand, "--endpoint ") < 2 {
		t.Fatalf("agentCommand lists not every endpoint: %s", code.AgentCommand)
	}

	rotated, err := b.Admin.RotateCA(ctx)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "A serves the root rotated on B", func() bool { _, f := a.CA(); return f == rotated.Fingerprint })
	fresh, _ := mint(t, a, adminapi.MintCodeRequest{AutoApprove: true})
	if j, _, err := join(t, b, fresh, wire.Facts{}); err != nil || j.Identity.CAFingerprint != rotated.Fingerprint {
		t.Fatalf("a code minted after the rotation: %v", err)
	}

	// A listener with its own keys (its own KEK) refuses to serve.
	own := filepath.Join(t.TempDir(), "own")
	if _, err := listener.Init(ctx, listener.InitConfig{DataDir: own, KSF: pake.LightestKSF}); err != nil {
		t.Fatal(err)
	}
	_, err = listener.New(ctx, listener.Config{DataDir: own, Store: st})
	if err == nil || !strings.Contains(err.Error(), "not the key-encryption key of the cluster") {
		t.Fatalf("a listener with its own keys: %v", err)
	}
	// Given the cluster's KEK, its own CA and OPAQUE keys still differ.
	raw, _ := os.ReadFile(kek)
	if err := os.WriteFile(filepath.Join(own, "keys", listener.KEKFile), raw, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = listener.New(ctx, listener.Config{DataDir: own, Store: st})
	if err == nil || !strings.Contains(err.Error(), "OPAQUE keys differ") {
		t.Fatalf("a listener with the cluster's KEK but its own keys: %v", err)
	}

	// The store holds no key material in clear.
	assertNoKeyMaterial(t, st, a.DataDir)
}

// assertNoKeyMaterial looks for the CA key and the OPAQUE keys (which hold
// the OPRF seed) in every key and value of the store, raw, hex and base64.
// The public roots must be found by the same search, or it proves nothing.
func assertNoKeyMaterial(t *testing.T, st store.Store, dataDir string) {
	t.Helper()
	kvs, err := st.List(context.Background(), "", "", 0)
	if err != nil {
		t.Fatal(err)
	}
	var all bytes.Buffer
	for _, kv := range kvs {
		all.WriteString(kv.Key + "\x00")
		all.Write(kv.Value)
		all.WriteString("\x00")
	}
	needles, err := secretscan.KeyDirNeedles(filepath.Join(dataDir, "keys"))
	if err != nil {
		t.Fatal(err)
	}
	if hits := secretscan.Bytes("store", all.Bytes(), needles); len(hits) != 0 {
		t.Errorf("the store holds key material in clear: %v", hits[0])
	}
	roots, err := pki.ParseCertsPEM(mustRead(t, filepath.Join(dataDir, "keys", authority.RootsFile)))
	if err != nil {
		t.Fatal(err)
	}
	if hits := secretscan.Bytes("store", all.Bytes(), secretscan.Windows("root", roots[0].Raw[:100], 24)); len(hits) == 0 {
		t.Error("positive control: the public root is not found in the store either, so the search cannot find anything")
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestAgentFailsOverToTheNextEndpoint: the first endpoint is a socket that
// never answers; the join goes through the second and costs the code no
// attempt, and a renewal fails over the same way.
func TestAgentFailsOverToTheNextEndpoint(t *testing.T) {
	l := listenertest.Start(t, listenertest.Options{})
	dead, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dead.Close() })
	sec, code := mint(t, l, adminapi.MintCodeRequest{AutoApprove: true})
	dir := filepath.Join(t.TempDir(), "state")
	j, err := agent.Join(context.Background(), agent.JoinConfig{StateDir: dir, Endpoint: dead.LocalAddr().String(), Endpoints: []string{l.Endpoint}, Secret: sec})
	if err != nil {
		t.Fatalf("join with the first endpoint down: %v", err)
	}
	if j.Identity.Endpoint != l.Endpoint || len(j.Identity.Endpoints) != 2 {
		t.Fatalf("identity endpoints %s %v", j.Identity.Endpoint, j.Identity.Endpoints)
	}
	c, err := l.Admin.Code(context.Background(), code.ID)
	if err != nil || c.Uses != 1 || c.FailedAttempts != 0 {
		t.Fatalf("code after failover: %+v %v", c, err)
	}
	// Put the dead endpoint first again: the renewal must fail over too.
	st := agent.State{Dir: dir}
	id, _, err := st.Identity()
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(filepath.Join(dir, agent.NodeFile))
	raw = bytes.Replace(raw, []byte(`"endpoint": "`+l.Endpoint+`"`), []byte(`"endpoint": "`+dead.LocalAddr().String()+`"`), 1)
	if err := os.WriteFile(filepath.Join(dir, agent.NodeFile), raw, 0o600); err != nil {
		t.Fatal(err)
	}
	if id2, _, _ := st.Identity(); id2.Endpoint == id.Endpoint {
		t.Fatalf("node.json not rewritten: %s", raw)
	}
	renewed, err := agent.Renew(context.Background(), agent.RenewConfig{StateDir: dir})
	if err != nil || renewed.Endpoint != l.Endpoint {
		t.Fatalf("renewal with the first endpoint down: %v (through %s)", err, renewed.Endpoint)
	}
}

// TestConcurrentRotationsConverge: two listeners rotating at the same
// moment end up serving one CA, the one the store holds; a rotation that
// lost its compare-and-swap says so.
func TestConcurrentRotationsConverge(t *testing.T) {
	st, err := boltstore.Open(filepath.Join(t.TempDir(), "shared.db"), boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	a := listenertest.Start(t, listenertest.Options{Init: listener.InitConfig{Store: st}, Config: listener.Config{Store: st}})
	kek := filepath.Join(a.DataDir, "keys", listener.KEKFile)
	b := listenertest.Start(t, listenertest.Options{Init: listener.InitConfig{Store: st, Join: true, KEKFile: kek}, Config: listener.Config{Store: st}})
	type outcome struct {
		fp  string
		err error
	}
	for range 5 {
		out := make(chan outcome, 2)
		for _, l := range []*listenertest.Listener{a, b} {
			go func() {
				fp, err := l.RotateCA(context.Background(), "test")
				out <- outcome{fp, err}
			}()
		}
		var won []string
		for range 2 {
			o := <-out
			switch {
			case o.err == nil:
				won = append(won, o.fp)
			case !strings.Contains(o.err.Error(), "at the same moment"):
				t.Fatalf("a losing rotation: %v", o.err)
			}
		}
		if len(won) == 0 {
			t.Fatal("neither rotation won")
		}
		// Two wins were sequential: the later one is the store's, and
		// the one that finished last need not be it.
		waitFor(t, "both serve one CA", func() bool {
			_, fa := a.CA()
			_, fb := b.CA()
			return fa == fb && (len(won) == 2 || fa == won[0])
		})
	}
}
