package e2e

import (
	"bufio"
	"context"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stratumjoin/stratum/internal/joincode"
)

// TestAgentExitStatus checks the statuses of docs/architecture.md#parts that
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
			// the contract tests wait out the default dial timeout
			r := agentJoin(ctx, tc.endpoint, tc.code, filepath.Join(dir, tc.name), "--dial-timeout", "2s")
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

// TestMakeInstall installs binaries and units into a DESTDIR, with the
// units naming the binaries under PREFIX.
func TestMakeInstall(t *testing.T) {
	dest := t.TempDir()
	cmd := exec.Command("make", "install", "DESTDIR="+dest, "PREFIX=/usr")
	cmd.Dir = moduleRoot(t)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make install: %v\n%s", err, out)
	}
	for unit, want := range map[string]string{
		"stratum-agent.service":    "ExecStart=/usr/bin/stratum-agent run",
		"stratum-listener.service": "ExecStart=/usr/bin/stratum-listener serve",
	} {
		b, err := os.ReadFile(filepath.Join(dest, "lib/systemd/system", unit))
		if err != nil || !strings.Contains(string(b), "\n"+want) || strings.Contains(string(b), "/usr/local/bin") {
			t.Errorf("%s with PREFIX=/usr does not start %s: %v", unit, want, err)
		}
	}
	// the listener is static; the agent needs no glibc newer than 2.34
	if l, err := elf.Open(filepath.Join(dest, "usr/bin/stratum-listener")); err != nil {
		t.Error(err)
	} else {
		for _, p := range l.Progs {
			if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
				t.Errorf("the listener is dynamically linked (%v)", p.Type)
			}
		}
		l.Close()
	}
	if a, err := elf.Open(filepath.Join(dest, "usr/bin/stratum-agent")); err != nil {
		t.Error(err)
	} else {
		syms, err := a.DynamicSymbols()
		if err != nil {
			t.Fatal(err)
		}
		floor := "2.0"
		for _, s := range syms {
			if v, ok := strings.CutPrefix(s.Version, "GLIBC_"); ok && versionLess(floor, v) {
				floor = v
			}
		}
		t.Logf("the agent needs glibc %s", floor)
		if versionLess("2.34", floor) {
			t.Errorf("the agent needs glibc %s, more than 2.34", floor)
		}
		a.Close()
	}
	for _, f := range []string{"usr/bin/stratum-agent", "usr/bin/stratum-listener", "lib/systemd/system/stratum-agent.service", "lib/systemd/system/stratum-listener.service", "lib/systemd/system/stratum-listener.socket", "lib/systemd/system/stratum-listener-admin.socket"} {
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

// versionLess compares dotted versions ("2.3.2" < "2.34").
func versionLess(a, b string) bool {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < len(as) || i < len(bs); i++ {
		var x, y int
		if i < len(as) {
			x, _ = strconv.Atoi(as[i])
		}
		if i < len(bs) {
			y, _ = strconv.Atoi(bs[i])
		}
		if x != y {
			return x < y
		}
	}
	return false
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
