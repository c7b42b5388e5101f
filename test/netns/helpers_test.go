package netns

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The two ends of the test network. Each lives in a namespace this test
// creates, so they reach nothing else and collide with nothing else.
const (
	listenerAddr = "10.77.0.1"
	agentAddr    = "10.77.0.2"
	joinPort     = "9444"
	endpoint     = listenerAddr + ":" + joinPort
)

// network is a listener namespace and an agent namespace joined by a veth
// pair; ListenerIf lives in the first, AgentIf in the second.
type network struct {
	ListenerNS, AgentNS string
	ListenerIf, AgentIf string
}

// newNetwork creates the namespaces and the link; they are deleted when
// the test ends (deleting a namespace destroys its end of the veth pair,
// and with it the other end).
func newNetwork(t *testing.T) *network {
	t.Helper()
	b := make([]byte, 3)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	id := hex.EncodeToString(b) // interface names are at most 15 bytes
	n := &network{ListenerNS: "sj-l-" + id, AgentNS: "sj-a-" + id, ListenerIf: "sjl" + id, AgentIf: "sja" + id}
	for _, ns := range []string{n.ListenerNS, n.AgentNS} {
		ip(t, "netns", "add", ns)
		t.Cleanup(func() {
			if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
				t.Errorf("ip netns del %s: %v: %s", ns, err, out)
			}
		})
	}
	ip(t, "link", "add", n.ListenerIf, "netns", n.ListenerNS, "type", "veth", "peer", "name", n.AgentIf, "netns", n.AgentNS)
	for _, end := range []struct{ ns, ifname, addr string }{{n.ListenerNS, n.ListenerIf, listenerAddr}, {n.AgentNS, n.AgentIf, agentAddr}} {
		ip(t, "-n", end.ns, "addr", "add", end.addr+"/24", "dev", end.ifname)
		ip(t, "-n", end.ns, "link", "set", "dev", end.ifname, "up")
		ip(t, "-n", end.ns, "link", "set", "dev", "lo", "up")
	}
	return n
}

// SetAgentMAC gives the agent's interface mac, as an operator's NIC would
// have it.
func (n *network) SetAgentMAC(t *testing.T, mac string) {
	t.Helper()
	ip(t, "-n", n.AgentNS, "link", "set", "dev", n.AgentIf, "address", mac)
}

func ip(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// result is how a command ended.
type result struct {
	exit           int
	stdout, stderr string
}

func (r result) String() string {
	return "exit " + strconv.Itoa(r.exit) + "\nstdout:\n" + r.stdout + "\nstderr:\n" + r.stderr
}

// runIn runs one of the built binaries inside namespace ns ("" for the
// test's own), with stdin and extra environment.
func runIn(t *testing.T, ns string, env []string, stdin, bin string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	path := filepath.Join(binDir, bin)
	var cmd *exec.Cmd
	if ns == "" {
		cmd = exec.CommandContext(ctx, path, args...)
	} else {
		cmd = exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", ns, path}, args...)...)
	}
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdin = strings.NewReader(stdin)
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	err := cmd.Run()
	r := result{stdout: so.String(), stderr: se.String()}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		r.exit = ee.ExitCode()
	case err != nil:
		t.Fatalf("%s %s: %v", bin, strings.Join(args, " "), err)
	}
	return r
}

// lockedBuffer collects a process's stderr while tests read it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// listenerProc is `stratum-listener serve` running in the listener
// namespace, with its admin socket on the shared filesystem.
type listenerProc struct {
	t      *testing.T
	sock   string
	cmd    *exec.Cmd
	stderr *lockedBuffer
}

// startListener inits a data directory and serves it on the listener
// namespace's end of the link until the test ends.
func startListener(t *testing.T, n *network) *listenerProc {
	t.Helper()
	sockDir, err := os.MkdirTemp("/tmp", "sjnetns") // unix socket paths are short
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	data := filepath.Join(t.TempDir(), "listener")
	if r := runIn(t, n.ListenerNS, nil, "", "stratum-listener", "init", "--data", data, "--light-ksf", "--endpoint", endpoint); r.exit != 0 {
		t.Fatalf("listener init: %s", r)
	}
	p := &listenerProc{t: t, sock: filepath.Join(sockDir, "admin.sock"), stderr: &lockedBuffer{}}
	p.cmd = exec.Command("ip", "netns", "exec", n.ListenerNS, filepath.Join(binDir, "stratum-listener"),
		"serve", "--data", data, "--listen", endpoint, "--admin-socket", p.sock)
	p.cmd.Stderr = p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.stop)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if r := p.admin("ca", "show"); r.exit == 0 {
			return p
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("listener did not come up in 10s:\n%s", p.stderr)
	return nil
}

// stop ends the listener (ip netns exec execs it, so the pid is the
// listener's own).
func (p *listenerProc) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-done
		p.t.Errorf("listener did not stop on SIGTERM within 10s")
	}
}

// admin runs an admin subcommand against the listener's socket from the
// test's own namespace.
func (p *listenerProc) admin(args ...string) result {
	p.t.Helper()
	return runIn(p.t, "", []string{"STRATUM_ADMIN_SOCKET=" + p.sock}, "", "stratum-listener", args...)
}

// adminJSON runs an admin subcommand with --json, which must succeed, and
// decodes its output into v.
func (p *listenerProc) adminJSON(v any, args ...string) {
	p.t.Helper()
	r := p.admin(append(args, "--json")...)
	if r.exit != 0 {
		p.t.Fatalf("stratum-listener %s: %s", strings.Join(args, " "), r)
	}
	if err := json.Unmarshal([]byte(r.stdout), v); err != nil {
		p.t.Fatalf("stratum-listener %s: %v\n%s", strings.Join(args, " "), err, r.stdout)
	}
}

// code is a join code as `codes create/show --json` print it.
type code struct {
	ID             string          `json:"id"`
	Code           string          `json:"code"`
	State          string          `json:"state"`
	Uses           int             `json:"uses"`
	Registrations  int             `json:"registrations"`
	FailedAttempts int             `json:"failedAttempts"`
	AllowReclaim   bool            `json:"allowReclaim"`
	Expect         json.RawMessage `json:"expect"`
}

// claimedFacts are a node's facts as `nodes show --json` prints them.
type claimedFacts struct {
	ProductUUID string   `json:"productUuid"`
	Serial      string   `json:"serial"`
	MACs        []string `json:"macs"`
}

type node struct {
	ID           string       `json:"id"`
	State        string       `json:"state"`
	ClaimedFacts claimedFacts `json:"claimedFacts"`
	FactsNote    string       `json:"factsNote"`
}
