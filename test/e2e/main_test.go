// Package e2e runs the real binaries: a listener process that can be
// killed, agents whose stderr can be read, files that can be grepped.
package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stratumjoin/stratum/internal/testbin"
)

var binDir string

func TestMain(m *testing.M) {
	os.Exit(testbin.Run(m, &binDir, "./cmd/stratum-listener", "./cmd/stratum-agent"))
}

// listenerProc is a `stratum-listener serve` process.
type listenerProc struct {
	t        *testing.T
	data     string
	sock     string
	endpoint string
	cmd      *exec.Cmd
	stderr   *bytes.Buffer
	logs     []string // stderr of earlier runs
	// serveArgs are added to serve at the next start; env to its
	// environment.
	serveArgs []string
	env       []string
}

func newListener(t *testing.T, extraInit ...string) *listenerProc {
	t.Helper()
	return newListenerServe(t, nil, extraInit...)
}

// newListenerServe is newListener with extra flags for serve.
func newListenerServe(t *testing.T, serve []string, extraInit ...string) *listenerProc {
	t.Helper()
	sockDir, err := os.MkdirTemp("/tmp", "sje2e")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	p := &listenerProc{t: t, data: filepath.Join(t.TempDir(), "listener"), sock: filepath.Join(sockDir, "admin.sock"), endpoint: freeUDP(t), serveArgs: serve}
	run(t, nil, "stratum-listener", append([]string{"init", "--data", p.data, "--light-ksf", "--endpoint", p.endpoint}, extraInit...)...)
	p.start()
	t.Cleanup(p.stop)
	return p
}

func (p *listenerProc) start() {
	p.t.Helper()
	p.stderr = new(bytes.Buffer)
	p.cmd = exec.Command(filepath.Join(binDir, "stratum-listener"), append([]string{"serve", "--data", p.data, "--listen", p.endpoint, "--admin-socket", p.sock, "--log-level", "debug"}, p.serveArgs...)...)
	if p.env != nil {
		p.cmd.Env = append(os.Environ(), p.env...)
	}
	p.cmd.Stderr = p.stderr
	if err := p.cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := p.admin("ca", "show"); err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	p.t.Fatalf("listener did not come up: %s", p.stderr)
}

func (p *listenerProc) kill() {
	p.cmd.Process.Signal(syscall.SIGKILL)
	p.cmd.Wait()
	p.logs = append(p.logs, p.stderr.String())
	p.cmd = nil
}

func (p *listenerProc) stop() {
	if p.cmd == nil {
		return
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		p.cmd.Process.Kill()
		<-done
	}
	p.logs = append(p.logs, p.stderr.String())
	p.cmd = nil
}

func (p *listenerProc) admin(args ...string) ([]byte, error) {
	cmd := exec.Command(filepath.Join(binDir, "stratum-listener"), args...)
	cmd.Env = append(os.Environ(), "STRATUM_ADMIN_SOCKET="+p.sock)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("%v: %w: %s", args, err, stderr.String())
	}
	return out, nil
}

func (p *listenerProc) adminJSON(v any, args ...string) {
	p.t.Helper()
	out, err := p.admin(append(args, "--json")...)
	if err != nil {
		p.t.Fatal(err)
	}
	if err := json.Unmarshal(out, v); err != nil {
		p.t.Fatalf("%v: %v\n%s", args, err, out)
	}
}

type mintedCode struct {
	ID             string `json:"id"`
	Code           string `json:"code"`
	FailedAttempts int    `json:"failedAttempts"`
	State          string `json:"state"`
	RevokedBy      string `json:"revokedBy"`
	Uses           int    `json:"uses"`
	Registrations  int    `json:"registrations"`
	MaxUses        int    `json:"maxUses"`
}

// agentRun runs `stratum-agent args...` with the code on stdin.
type agentResult struct {
	exit           int
	stdout, stderr string
}

func agentJoin(ctx context.Context, endpoint, code, state string, extra ...string) agentResult {
	args := append([]string{"join", "--endpoint", endpoint, "--code", "-", "--state", state, "--root", state + "-noroot"}, extra...)
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "stratum-agent"), args...)
	cmd.Stdin = strings.NewReader(code + "\n")
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	err := cmd.Run()
	r := agentResult{stdout: so.String(), stderr: se.String()}
	if ee, ok := err.(*exec.ExitError); ok {
		r.exit = ee.ExitCode()
	} else if err != nil {
		r.exit = -1
		r.stderr += err.Error()
	}
	return r
}

func run(t *testing.T, stdin []byte, bin string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, bin), args...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", bin, args, err, out)
	}
	return out
}
