// Package service runs stratum-agent and stratum-listener as systemd
// would: a NOTIFY_SOCKET that records READY, STATUS, WATCHDOG and
// STOPPING; the join code as a credential; the listener's sockets handed
// in by socket activation. The binaries are built once, with go build.
package service

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stratumjoin/stratum/internal/procmem"
	"github.com/stratumjoin/stratum/internal/testbin"
)

var binDir string

func TestMain(m *testing.M) {
	os.Exit(testbin.Run(m, &binDir, "./cmd/stratum-agent", "./cmd/stratum-listener"))
}

func bin(name string) string { return filepath.Join(binDir, name) }

// shortDir is a directory under /tmp, for unix socket paths (108 bytes).
func shortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", "sjsvc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// notifyMsg is one sd_notify datagram.
type notifyMsg struct {
	at   time.Time
	text string
	// seen is what the test's check found when the message arrived.
	seen bool
}

func (m notifyMsg) has(field string) bool {
	for _, l := range strings.Split(m.text, "\n") {
		if l == field {
			return true
		}
	}
	return false
}

func (m notifyMsg) status() string {
	for _, l := range strings.Split(m.text, "\n") {
		if s, ok := strings.CutPrefix(l, "STATUS="); ok {
			return s
		}
	}
	return ""
}

// notifySocket is the service manager's end of NOTIFY_SOCKET.
type notifySocket struct {
	path string
	conn *net.UnixConn
	// check runs as each message arrives, before the test sees it.
	check func(text string) bool

	mu   sync.Mutex
	msgs []notifyMsg
	more chan struct{}
}

func newNotifySocket(t *testing.T, check func(string) bool) *notifySocket {
	t.Helper()
	path := filepath.Join(shortDir(t), "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	n := &notifySocket{path: path, conn: conn, check: check, more: make(chan struct{}, 1)}
	t.Cleanup(func() { conn.Close() })
	go n.read()
	return n
}

func (n *notifySocket) read() {
	buf := make([]byte, 4096)
	for {
		k, err := n.conn.Read(buf)
		if err != nil {
			return
		}
		m := notifyMsg{at: time.Now(), text: string(buf[:k])}
		if n.check != nil {
			m.seen = n.check(m.text)
		}
		n.mu.Lock()
		n.msgs = append(n.msgs, m)
		n.mu.Unlock()
		select {
		case n.more <- struct{}{}:
		default:
		}
	}
}

func (n *notifySocket) all() []notifyMsg {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]notifyMsg(nil), n.msgs...)
}

// wait returns the first message at index from or later that match
// accepts, and its index.
func (n *notifySocket) wait(t *testing.T, from int, d time.Duration, what string, match func(notifyMsg) bool) (int, notifyMsg) {
	t.Helper()
	deadline := time.After(d)
	for {
		msgs := n.all()
		for i := from; i < len(msgs); i++ {
			if match(msgs[i]) {
				return i, msgs[i]
			}
		}
		select {
		case <-n.more:
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			t.Fatalf("no %s within %s; got:\n%s", what, d, n.dump())
		}
	}
}

// statuses are the STATUS lines from index from on, in order.
func (n *notifySocket) statuses(from int) []string {
	var out []string
	for _, m := range n.all()[from:] {
		if s := m.status(); s != "" {
			out = append(out, s)
		}
	}
	return out
}

func (n *notifySocket) dump() string {
	var b strings.Builder
	for _, m := range n.all() {
		fmt.Fprintf(&b, "  %s %q\n", m.at.Format("15:04:05.000"), m.text)
	}
	return b.String()
}

func field(f string) func(notifyMsg) bool { return func(m notifyMsg) bool { return m.has(f) } }

func statusPrefix(p string) func(notifyMsg) bool {
	return func(m notifyMsg) bool { return strings.HasPrefix(m.status(), p) }
}

// proc is a started binary whose output goes to a file.
type proc struct {
	cmd  *exec.Cmd
	out  string
	done chan struct{}
	err  error
}

func start(t *testing.T, cmd *exec.Cmd) *proc {
	t.Helper()
	p := &proc{cmd: cmd, out: filepath.Join(t.TempDir(), filepath.Base(cmd.Path)+".log"), done: make(chan struct{})}
	f, err := os.Create(p.out)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// exit waits for the process and returns its exit status.
func (p *proc) exit(t *testing.T, d time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(d):
		t.Fatalf("%s still running after %s; output:\n%s", p.cmd.Path, d, p.output())
	}
	if p.err == nil {
		return 0
	}
	if ee, ok := p.err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	t.Fatalf("%s: %v", p.cmd.Path, p.err)
	return -1
}

func (p *proc) output() string {
	b, _ := os.ReadFile(p.out)
	return string(b)
}

// memory reads VmRSS and VmHWM (KiB) from /proc/PID/status.
func memory(t *testing.T, pid int) (rss, hwm int) {
	t.Helper()
	st, err := procmem.ReadStatus(pid)
	if err != nil {
		t.Fatal(err)
	}
	return st.RSS, st.HWM
}

// agentStatus runs `stratum-agent status --json`.
func agentStatus(t *testing.T, state string) map[string]any {
	t.Helper()
	out, err := exec.Command(bin("stratum-agent"), "status", "--json", "--state", state).Output()
	if err != nil {
		t.Fatalf("status --json: %v\n%s", err, out)
	}
	var m map[string]any
	if err := json.Unmarshal(out, &m); err != nil {
		t.Fatalf("status --json: %v\n%s", err, out)
	}
	return m
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func writeCode(t *testing.T, dir, code string) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "join-code")
	if err := os.WriteFile(path, []byte(code+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// repoRoot is the module root (for testdata).
func repoRoot(t *testing.T) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Dir(filepath.Dir(wd))
}
