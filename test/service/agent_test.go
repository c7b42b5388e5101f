package service

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stratumjoin/stratum/internal/testbin"

	"github.com/stratumjoin/stratum/agent"
	"github.com/stratumjoin/stratum/internal/cluster"
	"github.com/stratumjoin/stratum/listener"
	"github.com/stratumjoin/stratum/listener/adminapi"
	"github.com/stratumjoin/stratum/listener/listenertest"
)

// agentRun starts `stratum-agent run` the way stratum-agent.service does:
// the code in $CREDENTIALS_DIRECTORY/join-code, NOTIFY_SOCKET, and a
// watchdog of watchdogSec whose WATCHDOG_PID is the agent's (the shell
// execs it, keeping its pid).
func agentRun(t *testing.T, n *notifySocket, state, creds string, watchdog time.Duration, args ...string) *proc {
	t.Helper()
	hw := filepath.Join(repoRoot(t), "testdata", "sysfs", "dell-r760")
	argv := append([]string{"-c", `WATCHDOG_PID=$$ exec "$0" "$@"`, bin("stratum-agent"), "run", "--state", state, "--root", hw, "--log-level", "debug"}, args...)
	cmd := exec.Command("sh", argv...)
	cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+n.path)
	if creds != "" {
		cmd.Env = append(cmd.Env, "CREDENTIALS_DIRECTORY="+creds)
	}
	if watchdog > 0 {
		cmd.Env = append(cmd.Env, "WATCHDOG_USEC="+strconv.FormatInt(watchdog.Microseconds(), 10))
	}
	return start(t, cmd)
}

// TestAgentServiceLifecycle runs `stratum-agent run` as a Type=notify
// service with WatchdogSec=1s against a listener that hands out 6-second
// certificates and requires approval: STATUS follows joining, waiting
// for approval, joined; `stratum-listener joins list` shows the claimed
// facts and `joins approve` lets it go on; READY=1 comes once, only after
// node.json and node.crt are on disk; WATCHDOG=1 comes every half second;
// it renews over stratum-node/1; once `nodes revoke` revoked it, its
// renewal is refused, it says so, sends STOPPING=1 and exits 1.
func TestAgentServiceLifecycle(t *testing.T) {
	l := listenertest.Start(t, listenertest.Options{Init: listener.InitConfig{NodeLifetime: 6 * time.Second}})
	code, err := l.Admin.MintCode(context.Background(), adminapi.MintCodeRequest{})
	if err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(t.TempDir(), "state")
	creds := filepath.Dir(writeCode(t, filepath.Join(t.TempDir(), "creds"), code.Code))
	n := newNotifySocket(t, func(text string) bool {
		// at READY, the identity must already be on disk
		return fileExists(filepath.Join(state, agent.NodeFile)) && fileExists(filepath.Join(state, agent.CertFile))
	})
	p := agentRun(t, n, state, creds, time.Second, "--endpoint", l.Endpoint)

	i, m := n.wait(t, 0, 30*time.Second, "waiting for approval", statusPrefix("waiting for approval of join "))
	// STATUS= names the join and its SAS, the digits `joins list` shows
	joinID, sas, _ := strings.Cut(strings.TrimPrefix(m.status(), "waiting for approval of join "), "; SAS ")
	if got := n.statuses(0); got[0] != "joining "+l.Endpoint {
		t.Fatalf("first status %q", got[0])
	}
	if fileExists(filepath.Join(state, agent.NodeFile)) {
		t.Fatal("node.json exists while the join is pending")
	}
	var js struct{ Items []cluster.Join }
	if err := json.Unmarshal([]byte(admin(t, l, "joins", "list", "--json")), &js); err != nil {
		t.Fatal(err)
	}
	if len(js.Items) != 1 || js.Items[0].ID != joinID || !js.Items[0].IsPending() || js.Items[0].KeyFP == "" ||
		!strings.EqualFold(js.Items[0].Facts.ProductUUID, "4c4c4544-0037-5810-804a-b2c04f4b5133") || len(sas) != 6 || js.Items[0].SAS != sas {
		t.Fatalf("joins list: %+v", js.Items)
	}
	admin(t, l, "joins", "approve", joinID, "--sas", sas)

	r, ready := n.wait(t, i, 30*time.Second, "READY=1", field("READY=1"))
	if !ready.seen {
		t.Fatal("READY=1 arrived before node.json and node.crt were on disk")
	}
	for _, m := range n.all()[:r] {
		if m.has("READY=1") {
			t.Fatal("READY=1 before approval")
		}
	}
	id, _, err := agent.State{Dir: state}.Identity()
	if err != nil {
		t.Fatal(err)
	}
	if want := "joined as " + id.NodeID + " until " + id.NotAfter.UTC().Format(time.RFC3339); ready.status() != want {
		t.Fatalf("READY status %q, want %q", ready.status(), want)
	}
	readyAt := ready.at

	// Idle joined service: memory after the join settled.
	time.Sleep(2 * time.Second) // measured idle: the memory after the join settled
	rss, hwm := memory(t, p.cmd.Process.Pid)
	t.Logf("stratum-agent run, 2s after READY (just joined): VmRSS %.1f MiB, VmHWM %.1f MiB", float64(rss)/1024, float64(hwm)/1024)

	// Renewal at 2/3 of 6s (±0.5s) after the join.
	k, _ := n.wait(t, r+1, 15*time.Second, "renewal", statusPrefix("renewing"))
	k, renewed := n.wait(t, k+1, 15*time.Second, "renewed status", statusPrefix("joined as "+id.NodeID+" until "))
	if renewed.status() == ready.status() {
		t.Fatalf("renewal kept the old expiry: %q", renewed.status())
	}
	if after := renewed.at.Sub(readyAt); after < 3*time.Second || after > 6*time.Second {
		t.Errorf("renewed %s after READY; want about 4s (2/3 of 6s ± 1/12)", after)
	}
	st := agentStatus(t, state)
	if st["nodeId"] != id.NodeID || st["lastRenewal"] == nil || st["lastError"] != "" || st["role"] != "node" || st["trust"] != "platform" ||
		st["endpoint"] != l.Endpoint || st["caFingerprint"] != code.CAFingerprint || st["notAfter"] == nil {
		t.Fatalf("status --json after the renewal: %v", st)
	}

	// Revoked: the next renewal is refused for good.
	admin(t, l, "nodes", "revoke", id.NodeID)
	k, _ = n.wait(t, k+1, 15*time.Second, "refusal", statusPrefix("refused: "))
	n.wait(t, k+1, 10*time.Second, "STOPPING=1", field("STOPPING=1"))
	if code := p.exit(t, 10*time.Second); code != 1 {
		t.Fatalf("exit status %d after revocation, want 1; output:\n%s", code, p.output())
	}
	if st := agentStatus(t, state); !strings.Contains(st["lastError"].(string), "NODE_REVOKED") {
		t.Fatalf("status --json after revocation: %v", st)
	}

	// The whole conversation, without the pings.
	var seq []string
	readies := 0
	var pings []time.Time
	for _, m := range n.all() {
		switch {
		case m.text == "WATCHDOG=1":
			pings = append(pings, m.at)
			continue
		case m.has("READY=1"):
			readies++
		}
		seq = append(seq, strings.ReplaceAll(m.text, "\n", `\n`))
	}
	t.Logf("sd_notify messages (WATCHDOG=1 left out):\n  %s", strings.Join(seq, "\n  "))
	want := []string{"STATUS=joining ", "STATUS=waiting for approval of join ", `READY=1\nSTATUS=joined as `, "STATUS=renewing", "STATUS=joined as ", "STATUS=renewing", "STATUS=refused: ", "STOPPING=1"}
	if len(seq) != len(want) {
		t.Fatalf("%d messages, want %d", len(seq), len(want))
	}
	for i := range want {
		if !strings.HasPrefix(seq[i], want[i]) {
			t.Errorf("message %d is %q, want %q...", i, seq[i], want[i])
		}
	}
	if readies != 1 {
		t.Errorf("READY=1 sent %d times", readies)
	}

	// WatchdogSec=1s: a ping about every 500ms, the whole time.
	var gaps []time.Duration
	for i := 1; i < len(pings); i++ {
		gaps = append(gaps, pings[i].Sub(pings[i-1]))
	}
	slices.Sort(gaps)
	if len(gaps) < 10 {
		t.Fatalf("%d watchdog pings in %s", len(pings), pings[len(pings)-1].Sub(pings[0]))
	}
	median, longest := gaps[len(gaps)/2], gaps[len(gaps)-1]
	t.Logf("WATCHDOG=1: %d pings, median gap %s, longest %s (WatchdogSec=1s)", len(pings), median.Round(time.Millisecond), longest.Round(time.Millisecond))
	if median < 350*time.Millisecond || median > 700*time.Millisecond || longest > 1500*time.Millisecond {
		t.Errorf("watchdog gaps: median %s, longest %s; want about 500ms and no long silence", median, longest)
	}
}

// admin runs the stratum-listener admin CLI against l.
func admin(t *testing.T, l *listenertest.Listener, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin("stratum-listener"), args...)
	cmd.Env = append(os.Environ(), "STRATUM_ADMIN_SOCKET="+l.AdminSocket)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("stratum-listener %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// TestAgentIdleFootprint: a node that has joined (`stratum-agent join`)
// starts `run` with READY=1 at once, sits idle, and stops on SIGTERM with
// STOPPING=1 and exit status 0. Reports its memory and the binary's size.
func TestAgentIdleFootprint(t *testing.T) {
	l := listenertest.Start(t, listenertest.Options{})
	code, err := l.Admin.MintCode(context.Background(), adminapi.MintCodeRequest{AutoApprove: true})
	if err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(t.TempDir(), "state")
	codeFile := writeCode(t, filepath.Join(t.TempDir(), "code"), code.Code)
	hw := filepath.Join(repoRoot(t), "testdata", "sysfs", "dell-r760")
	if out, err := exec.Command(bin("stratum-agent"), "join", "--endpoint", l.Endpoint, "--code-file", codeFile, "--state", state, "--root", hw).CombinedOutput(); err != nil {
		t.Fatalf("join: %v\n%s", err, out)
	}

	n := newNotifySocket(t, nil)
	p := agentRun(t, n, state, "", 0) // the endpoint is remembered
	_, ready := n.wait(t, 0, 10*time.Second, "READY=1", field("READY=1"))
	if !strings.HasPrefix(ready.status(), "joined as node-") {
		t.Fatalf("READY status %q", ready.status())
	}
	time.Sleep(3 * time.Second) // measured idle: the memory of a joined service at rest
	rss, hwm := memory(t, p.cmd.Process.Pid)
	t.Logf("stratum-agent run, joined and idle for 3s: VmRSS %.1f MiB (peak %.1f MiB)", float64(rss)/1024, float64(hwm)/1024)
	if rss > 64*1024 {
		t.Errorf("idle agent RSS %d KiB: far over the 20 MiB target", rss)
	}

	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	n.wait(t, 0, 10*time.Second, "STOPPING=1", field("STOPPING=1"))
	if code := p.exit(t, 10*time.Second); code != 0 {
		t.Fatalf("exit status %d after SIGTERM, want 0; output:\n%s", code, p.output())
	}

	stripped := t.TempDir()
	if err := testbin.Build(stripped, []string{"-ldflags=-s -w"}, "./cmd/stratum-agent"); err != nil {
		t.Fatal(err)
	}
	for _, b := range []struct{ what, path string }{{"go build", bin("stratum-agent")}, {"go build -ldflags='-s -w'", filepath.Join(stripped, "stratum-agent")}} {
		fi, err := os.Stat(b.path)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("stratum-agent binary (%s): %d bytes (%.1f MiB)", b.what, fi.Size(), float64(fi.Size())/(1<<20))
	}
}

// TestAgentRunRefusedExits1: a permanent refusal is not retried: the
// agent says why and exits 1, which the unit's RestartPreventExitStatus
// keeps from restarting.
func TestAgentRunRefusedExits1(t *testing.T) {
	l := listenertest.Start(t, listenertest.Options{})
	code, err := l.Admin.MintCode(context.Background(), adminapi.MintCodeRequest{AutoApprove: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Admin.RevokeCode(context.Background(), code.ID); err != nil {
		t.Fatal(err)
	}
	creds := filepath.Dir(writeCode(t, filepath.Join(t.TempDir(), "creds"), code.Code))
	n := newNotifySocket(t, nil)
	p := agentRun(t, n, filepath.Join(t.TempDir(), "state"), creds, 0, "--endpoint", l.Endpoint)
	if code := p.exit(t, 30*time.Second); code != 1 {
		t.Fatalf("exit status %d, want 1; output:\n%s", code, p.output())
	}
	// the last datagram may still be on its way to the reader
	got := n.statuses(0)
	for deadline := time.Now().Add(10 * time.Second); len(got) < 2 && time.Now().Before(deadline); got = n.statuses(0) {
		time.Sleep(10 * time.Millisecond)
	}
	if len(got) != 2 || !strings.HasPrefix(got[1], "refused: the join code was revoked") {
		t.Fatalf("statuses %q", got)
	}
	if !strings.Contains(p.output(), "join refused: the join code was revoked") {
		t.Fatalf("output does not say why:\n%s", p.output())
	}
	for _, m := range n.all() {
		if m.has("READY=1") {
			t.Fatal("READY=1 without an identity")
		}
	}
}
