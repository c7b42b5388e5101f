package e2e

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stratumjoin/stratum/internal/joincode"
)

// TestAgentExitStatus checks the statuses of DESIGN.md section 10 that
// the other tests do not: 2 for usage errors (a typo caught by the check
// symbol included) and 3 for a listener that cannot be reached.
func TestAgentExitStatus(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	for _, tc := range []struct {
		name     string
		endpoint string
		code     string
		want     int
		stderr   string
	}{
		{"no endpoint", "", "4F7K2-Q9MXZ-T", 2, "--endpoint (or STRATUM_ENDPOINT) is required"},
		{"typo", "127.0.0.1:1", "4F7K2-Q9MXZ-0", 2, "check symbol"},
		{"not a code", "127.0.0.1:1", "hello", 2, "not a join code"},
		{"unreachable", freeUDP(t), validCode(t), 3, "could not reach the listener"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := agentJoin(ctx, tc.endpoint, tc.code, filepath.Join(dir, tc.name))
			if r.exit != tc.want || !strings.Contains(r.stderr, tc.stderr) {
				t.Fatalf("exit %d (want %d), stderr %q", r.exit, tc.want, r.stderr)
			}
		})
	}
}

// validCode is a well-formed code no listener minted.
func validCode(t *testing.T) string {
	t.Helper()
	sec, err := joincode.NewCode("AB")
	if err != nil {
		t.Fatal(err)
	}
	return sec.Display()
}

// TestMakeInstall installs binaries and units into a DESTDIR.
func TestMakeInstall(t *testing.T) {
	dest := t.TempDir()
	cmd := exec.Command("make", "install", "DESTDIR="+dest)
	cmd.Dir = moduleRoot(t)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make install: %v\n%s", err, out)
	}
	for _, f := range []string{"usr/local/bin/stratum-agent", "usr/local/bin/stratum-listener", "lib/systemd/system/stratum-agent.service", "lib/systemd/system/stratum-listener.service", "lib/systemd/system/stratum-listener.socket", "lib/systemd/system/stratum-listener-admin.socket"} {
		fi, err := os.Stat(filepath.Join(dest, f))
		if err != nil {
			t.Errorf("not installed: %s", f)
			continue
		}
		if strings.Contains(f, "/bin/") && fi.Mode().Perm() != 0o755 {
			t.Errorf("%s is %o", f, fi.Mode().Perm())
		}
	}
}

func moduleRoot(t *testing.T) string {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Dir(strings.TrimSpace(string(out)))
}

// TestEventsFollow: `events --follow` prints events as they happen.
func TestEventsFollow(t *testing.T) {
	l := newListener(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "stratum-listener"), "events", "--follow", "--json")
	cmd.Env = append(os.Environ(), "STRATUM_ADMIN_SOCKET="+l.sock)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	for i := range 2 {
		var c mintedCode
		l.adminJSON(&c, "codes", "create", "--auto-approve", "--max-uses", "1", "--pool", fmt.Sprint("follow-", i))
		select {
		case line := <-lines:
			if !strings.Contains(line, `"security.join-code.created"`) || !strings.Contains(line, c.ID) {
				t.Fatalf("event %d: %s", i, line)
			}
			if strings.Contains(line, c.Code) {
				t.Fatal("the code reached the event stream")
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no event %d within 10s", i)
		}
	}
}
