package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stratumjoin/stratum/internal/keyseal"
	"github.com/stratumjoin/stratum/internal/secretscan"
	"github.com/stratumjoin/stratum/internal/store/etcdtest"
	"github.com/stratumjoin/stratum/pki"
)

// clusterListener is a listener process of the cluster.
func clusterListener(t *testing.T, data string, serveArgs, env []string) *listenerProc {
	t.Helper()
	sockDir, err := os.MkdirTemp("/tmp", "sje2e")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	p := &listenerProc{t: t, data: data, sock: filepath.Join(sockDir, "admin.sock"), endpoint: settingsEndpoint(t, data), serveArgs: serveArgs, env: env}
	p.start()
	t.Cleanup(p.stop)
	return p
}

func settingsEndpoint(t *testing.T, data string) string {
	t.Helper()
	var s struct {
		Endpoints []string `json:"endpoints"`
	}
	b, err := os.ReadFile(filepath.Join(data, "listener.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	return s.Endpoints[0]
}

func (p *listenerProc) caFingerprint() string {
	p.t.Helper()
	var v struct {
		Fingerprint string `json:"caFingerprint"`
	}
	p.adminJSON(&v, "ca", "show")
	return v.Fingerprint
}

// exitOf runs a command and returns its exit status and combined output.
func exitOf(cmd *exec.Cmd) (int, string) {
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), string(out)
	}
	if err != nil {
		return -1, err.Error()
	}
	return 0, string(out)
}

// machine is an agent's state directory with a DMI tree of its own, so
// that each agent of the test is another machine to the listener.
func machine(t *testing.T, name string) (state, root string) {
	t.Helper()
	dir := t.TempDir()
	root = filepath.Join(dir, "root")
	if err := os.MkdirAll(filepath.Join(root, "sys/class/dmi/id"), 0o755); err != nil {
		t.Fatal(err)
	}
	uuid := fmt.Sprintf("4c4c4544-0000-1000-8000-%012x", time.Now().UnixNano()&0xffffffffffff)
	if err := os.WriteFile(filepath.Join(root, "sys/class/dmi/id/product_uuid"), []byte(uuid+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, name), root
}

// joinVia joins a new machine with code through endpoints, in order, and
// returns the state directory and how long the join took.
func joinVia(t *testing.T, code string, endpoints ...string) (string, time.Duration) {
	t.Helper()
	return joinWith(t, code, nil, endpoints...)
}

// joinWith is joinVia with more environment (STRATUM_ENDPOINT).
func joinWith(t *testing.T, code string, env []string, endpoints ...string) (string, time.Duration) {
	t.Helper()
	state, root := machine(t, "state")
	args := []string{"join", "--code", "-", "--state", state, "--root", root}
	for _, ep := range endpoints {
		args = append(args, "--endpoint", ep)
	}
	cmd := exec.Command(filepath.Join(binDir, "stratum-agent"), args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdin = strings.NewReader(code + "\n")
	start := time.Now()
	rc, out := exitOf(cmd)
	took := time.Since(start)
	if rc != 0 {
		t.Fatalf("join through %v: exit %d\n%s", endpoints, rc, out)
	}
	return state, took
}

type nodeView struct {
	Endpoint      string `json:"endpoint"`
	CAFingerprint string `json:"caFingerprint"`
}

func readNode(t *testing.T, state string) (nodeView, map[string]any) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(state, "node.json"))
	if err != nil {
		t.Fatal(err)
	}
	var v nodeView
	var m map[string]any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	json.Unmarshal(b, &m)
	return v, m
}

// TestSeveralListenersOneCluster runs three etcd members (TLS, client
// certificates and user authentication on) and three listener processes
// as one cluster: see docs/cluster.md.
func TestSeveralListenersOneCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("builds etcd and runs six processes")
	}
	etcd := etcdtest.StartProcs(t, 3, etcdtest.WithClientCertAuth(), etcdtest.WithAuth("root-pw"))
	dir := t.TempDir()
	pw := filepath.Join(dir, "etcd-password")
	if err := os.WriteFile(pw, []byte("root-pw\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var hosts, dataDirs []string
	for _, m := range etcd.Members {
		hosts = append(hosts, strings.TrimPrefix(m.ClientURL, "https://"))
		dataDirs = append(dataDirs, m.DataDir)
	}
	rogue := etcdtest.WriteTLSFiles(t, t.TempDir())
	storeURL := "etcds://" + strings.Join(hosts, ",") + "/ha"
	etcdFlags := []string{"--store", storeURL, "--etcd-cacert", etcd.CAFile, "--etcd-cert", etcd.ClientCertFile, "--etcd-key", etcd.ClientKeyFile, "--etcd-user", etcd.User, "--etcd-password-file", pw}
	eps := []string{freeUDP(t), freeUDP(t), freeUDP(t)}
	data := []string{filepath.Join(dir, "l1"), filepath.Join(dir, "l2"), filepath.Join(dir, "l3")}
	listenerCmd := func(args ...string) *exec.Cmd {
		return exec.Command(filepath.Join(binDir, "stratum-listener"), args...)
	}

	// Listener 1 makes the cluster; a plain init of listener 2 is refused
	// with the command that adds it; init --join adds listeners 2 and 3.
	run(t, nil, "stratum-listener", append([]string{"init", "--data", data[0], "--light-ksf", "--endpoint", eps[0]}, etcdFlags...)...)
	rc, out := exitOf(listenerCmd(append([]string{"init", "--data", data[1], "--endpoint", eps[1]}, etcdFlags...)...))
	wantCmd := "stratum-listener init --join --kek FILE --store " + storeURL
	if rc != 1 || !strings.Contains(out, "already holds a cluster") || !strings.Contains(out, wantCmd) {
		t.Fatalf("a second init on the store: exit %d, want 1 and the command %q:\n%s", rc, wantCmd, out)
	}
	if _, err := os.Stat(filepath.Join(data[1], "keys")); err == nil {
		t.Fatal("the refused init left a key directory")
	}
	kek := filepath.Join(dir, "cluster.kek")
	raw, err := os.ReadFile(filepath.Join(data[0], "keys", "cluster.kek"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(kek, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < 3; i++ {
		run(t, nil, "stratum-listener", append([]string{"init", "--join", "--kek", kek, "--data", data[i], "--endpoint", eps[i]}, etcdFlags...)...)
	}
	oldNeedles, err := secretscan.KeyDirNeedles(filepath.Join(data[0], "keys"))
	if err != nil {
		t.Fatal(err)
	}
	// Listeners 1 and 2 take the etcd settings as flags, listener 3 from
	// the environment, as a unit's environment file gives them.
	var ls []*listenerProc
	for i := range 2 {
		ls = append(ls, clusterListener(t, data[i], etcdFlags, nil))
	}
	ls = append(ls, clusterListener(t, data[2], nil, []string{
		"STRATUM_STORE=" + storeURL, "STRATUM_ETCD_CACERT=" + etcd.CAFile, "STRATUM_ETCD_CERT=" + etcd.ClientCertFile,
		"STRATUM_ETCD_KEY=" + etcd.ClientKeyFile, "STRATUM_ETCD_USER=" + etcd.User, "STRATUM_ETCD_PASSWORD_FILE=" + pw,
	}))
	fp := ls[0].caFingerprint()
	for i, l := range ls[1:] {
		if got := l.caFingerprint(); got != fp {
			t.Fatalf("listener %d: CA %s, listener 1: %s", i+2, got, fp)
		}
	}

	// A code minted on listener 1 joins through each of the others.
	var code mintedCode
	ls[0].adminJSON(&code, "codes", "create", "--auto-approve", "--max-uses", "2")
	var minted struct {
		Endpoints    []string `json:"endpoints"`
		AgentCommand string   `json:"agentCommand"`
	}
	mintOut, err := ls[0].admin("codes", "create", "--json", "--auto-approve", "--max-uses", "1")
	if err != nil {
		t.Fatal(err)
	}
	json.Unmarshal(mintOut, &minted)
	for _, ep := range eps {
		if !strings.Contains(minted.AgentCommand, "--endpoint "+ep) {
			t.Errorf("agentCommand does not list %s: %s", ep, minted.AgentCommand)
		}
	}
	early, _ := joinVia(t, code.Code, eps[1])
	joinVia(t, code.Code, eps[2])
	var after mintedCode
	ls[0].adminJSON(&after, "codes", "show", code.ID)
	if after.Uses != 2 || after.FailedAttempts != 0 {
		t.Fatalf("code minted on 1, joined through 2 and 3: uses %d, failed %d", after.Uses, after.FailedAttempts)
	}

	// A join waiting on listener 3 for approval is approved on listener 1:
	// listener 3 learns it through its etcd watch and the agent joins.
	ls[0].adminJSON(&code, "codes", "create", "--max-uses", "1")
	pendingState, pendingRoot := machine(t, "state")
	pendingJoin := exec.Command(filepath.Join(binDir, "stratum-agent"), "join", "--code", "-", "--state", pendingState, "--root", pendingRoot, "--endpoint", eps[2])
	pendingJoin.Stdin = strings.NewReader(code.Code + "\n")
	var pendingOut strings.Builder
	pendingJoin.Stdout, pendingJoin.Stderr = &pendingOut, &pendingOut
	if err := pendingJoin.Start(); err != nil {
		t.Fatal(err)
	}
	joined := make(chan error, 1)
	go func() { joined <- pendingJoin.Wait() }()
	var pending struct {
		Items []struct{ ID, State, SAS string } `json:"items"`
	}
	for waited := time.Now(); ; time.Sleep(50 * time.Millisecond) {
		ls[0].adminJSON(&pending, "joins", "list")
		if len(pending.Items) > 0 && pending.Items[0].State == "pending" {
			break
		}
		if time.Since(waited) > 30*time.Second {
			pendingJoin.Process.Kill()
			<-joined // the output is whole once the agent is gone
			t.Fatalf("no pending join listed on listener 1 after 30s; the agent said:\n%s", pendingOut.String())
		}
	}
	approving := time.Now()
	ls[0].adminJSON(&struct{}{}, "joins", "approve", pending.Items[0].ID, "--sas", pending.Items[0].SAS)
	approved := time.Since(approving)
	select {
	case err := <-joined:
		if err != nil {
			t.Fatalf("the join approved on listener 1 through listener 3: %v\n%s", err, pendingOut.String())
		}
	case <-time.After(30 * time.Second):
		pendingJoin.Process.Kill()
		<-joined
		t.Fatalf("the agent waiting on listener 3 did not finish within 30s of its approval on listener 1:\n%s", pendingOut.String())
	}
	t.Logf("figure: a join approved on listener 1 ended on listener 3 %v after the approval began (the approve command took %v)", time.Since(approving).Round(time.Millisecond), approved.Round(time.Millisecond))
	if n, _ := readNode(t, pendingState); n.Endpoint != eps[2] {
		t.Fatalf("the approved join recorded endpoint %s, want %s", n.Endpoint, eps[2])
	}

	// ca rotate on listener 2: listeners 1 and 3 serve the new root.
	var rotated struct {
		Fingerprint string `json:"caFingerprint"`
	}
	ls[1].adminJSON(&rotated, "ca", "rotate")
	start := time.Now()
	for _, i := range []int{0, 2} {
		for ls[i].caFingerprint() != rotated.Fingerprint {
			if time.Since(start) > 5*time.Second {
				t.Fatalf("listener %d does not serve the rotated root after 5s", i+1)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	t.Logf("figure: rotation on listener 2 served by listeners 1 and 3 after %v", time.Since(start).Round(time.Millisecond))
	ls[0].adminJSON(&code, "codes", "create", "--auto-approve", "--max-uses", "1")
	fresh, _ := joinVia(t, code.Code, eps[2])
	if n, _ := readNode(t, fresh); n.CAFingerprint != rotated.Fingerprint {
		t.Fatalf("a code minted after the rotation, joined through 3, pins %s", n.CAFingerprint)
	}

	// The agent that joined before the rotation renews through listener 1
	// and pins the new root. Its certificate is made due by moving notAfter
	// into the past, as if the machine had been off.
	n, m := readNode(t, early)
	if n.CAFingerprint != fp {
		t.Fatalf("early agent pins %s", n.CAFingerprint)
	}
	m["endpoint"], m["endpoints"] = eps[0], []string{eps[0]}
	m["notAfter"] = time.Now().Add(-time.Minute).UTC().Format(time.RFC3339)
	b, _ := json.MarshalIndent(m, "", "  ")
	if err := os.WriteFile(filepath.Join(early, "node.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	agentRun := exec.Command(filepath.Join(binDir, "stratum-agent"), "run", "--state", early, "--root", filepath.Join(filepath.Dir(early), "root"))
	runLog, _ := os.Create(filepath.Join(dir, "agent-run.log"))
	agentRun.Stdout, agentRun.Stderr = runLog, runLog
	if err := agentRun.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if n, _ := readNode(t, early); n.CAFingerprint == rotated.Fingerprint {
			break
		}
		if time.Now().After(deadline) {
			agentRun.Process.Kill()
			agentRun.Wait()
			log, _ := os.ReadFile(runLog.Name())
			t.Fatalf("the agent renewing through listener 1 does not pin the new root:\n%s", log)
		}
		time.Sleep(50 * time.Millisecond)
	}
	agentRun.Process.Signal(syscall.SIGTERM)
	agentRun.Wait()
	runLog.Close()

	// Listener 1 down: an agent given all three endpoints joins through
	// the second, and the code counts no failed attempt.
	ls[0].stop()
	ls[1].adminJSON(&code, "codes", "create", "--auto-approve", "--max-uses", "1")
	_, took := joinVia(t, code.Code, eps...)
	ls[1].adminJSON(&after, "codes", "show", code.ID)
	if after.Uses != 1 || after.FailedAttempts != 0 {
		t.Fatalf("failover join: uses %d, failed %d", after.Uses, after.FailedAttempts)
	}
	t.Logf("figure: join with the first of three endpoints down took %v", took.Round(time.Millisecond))
	// The same with the endpoints as the unit's environment file gives them.
	ls[2].adminJSON(&code, "codes", "create", "--auto-approve", "--max-uses", "1")
	state, _ := joinWith(t, code.Code, []string{"STRATUM_ENDPOINT=" + eps[0] + ", " + eps[1] + " " + eps[2]})
	if n, _ := readNode(t, state); n.Endpoint != eps[1] {
		t.Fatalf("STRATUM_ENDPOINT list: joined through %s, want %s", n.Endpoint, eps[1])
	}
	ls[2].adminJSON(&after, "codes", "show", code.ID)
	if after.Uses != 1 || after.FailedAttempts != 0 {
		t.Fatalf("failover join from STRATUM_ENDPOINT: uses %d, failed %d", after.Uses, after.FailedAttempts)
	}

	// A listener with keys of its own refuses to serve on the cluster's store.
	own := filepath.Join(dir, "own")
	run(t, nil, "stratum-listener", "init", "--data", own, "--light-ksf", "--endpoint", freeUDP(t))
	ownCtx, ownCancel := context.WithTimeout(context.Background(), 30*time.Second)
	rc, out = exitOf(exec.CommandContext(ownCtx, filepath.Join(binDir, "stratum-listener"), append([]string{"serve", "--data", own, "--listen", freeUDP(t), "--admin-socket", filepath.Join(dir, "own.sock")}, etcdFlags...)...))
	ownCancel()
	if rc != 1 || !strings.Contains(out, "refusing to serve") || !strings.Contains(out, "init --join") {
		t.Errorf("a listener with its own keys on the cluster's store: exit %d\n%s", rc, out)
	}

	// Wrong etcd credentials: the listener exits at once with the reason.
	bad := filepath.Join(dir, "bad-password")
	if err := os.WriteFile(bad, []byte("not-it\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"a client certificate of another CA", []string{"--etcd-cert", rogue.RogueCert, "--etcd-key", rogue.RogueKey}, "refused our client certificate"},
		{"a wrong password", []string{"--etcd-password-file", bad}, "rejected user"},
	} {
		args := append([]string{"serve", "--data", data[0], "--listen", eps[0], "--admin-socket", filepath.Join(dir, "x.sock")}, etcdFlags...)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		rc, out := exitOf(exec.CommandContext(ctx, filepath.Join(binDir, "stratum-listener"), append(args, tc.args...)...))
		cancel()
		if rc != 1 || !strings.Contains(out, tc.want) {
			t.Errorf("%s: exit %d, want 1 saying %q:\n%s", tc.name, rc, tc.want, out)
		}
	}

	// No private key, OPRF seed or KEK in clear in the etcd data
	// directories or a snapshot; the public root is found by the same
	// search, or it could find nothing.
	newNeedles, err := secretscan.KeyDirNeedles(filepath.Join(data[1], "keys"))
	if err != nil {
		t.Fatal(err)
	}
	k, err := keyseal.LoadKEK(kek)
	if err != nil {
		t.Fatal(err)
	}
	needles := append(append(oldNeedles, newNeedles...), secretscan.Windows("cluster.kek", k[:], 24)...)
	needles = append(needles, secretscan.Needle{Name: "cluster.kek file", Bytes: raw[:48]})
	snap := filepath.Join(dir, "snapshot.db")
	root := etcd.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rd, err := root.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	f, _ := os.Create(snap)
	if _, err := io.Copy(f, rd); err != nil {
		t.Fatal(err)
	}
	f.Close()
	rootsPEM, err := os.ReadFile(filepath.Join(data[1], "keys", "roots.pem"))
	if err != nil {
		t.Fatal(err)
	}
	roots, err := pki.ParseCertsPEM(rootsPEM)
	if err != nil {
		t.Fatal(err)
	}
	control := secretscan.Windows("public root", roots[0].Raw[:64], 24)
	for _, where := range append(dataDirs, snap) {
		hits, err := secretscan.Tree(where, needles)
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range hits {
			t.Errorf("%s holds %s in clear (%s)", h.Where, h.Name, h.Form)
		}
		if found, err := secretscan.Tree(where, control); err != nil || len(found) == 0 {
			t.Errorf("positive control: the public root is not found in %s either (%v)", where, err)
		}
	}
}
