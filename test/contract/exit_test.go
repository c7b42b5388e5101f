package contract

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coreos/go-systemd/v22/unit"

	"github.com/stratumjoin/stratum/internal/joincode"
	"github.com/stratumjoin/stratum/internal/testenv"
	"github.com/stratumjoin/stratum/systemd"
)

// proc is one run of a binary.
type proc struct {
	exit           int
	stdout, stderr string
}

type runOpts struct {
	env   []string
	stdin string
	// nobody runs the command as uid/gid 65534 (only when the test is root)
	nobody bool
}

func runBin(t *testing.T, o runOpts, bin string, args ...string) proc {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, bin), args...)
	cmd.Env = append(os.Environ(), o.env...)
	cmd.Stdin = strings.NewReader(o.stdin)
	if o.nobody {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	}
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	err := cmd.Run()
	p := proc{stdout: so.String(), stderr: se.String()}
	if ee, ok := err.(*exec.ExitError); ok {
		p.exit = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("%s %v: %v", bin, args, err)
	}
	return p
}

// server is a `stratum-listener serve` process on loopback.
type server struct {
	data, sock, endpoint string
}

func startServer(t *testing.T) *server {
	t.Helper()
	sockDir, err := os.MkdirTemp("/tmp", "sjexit")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &server{data: filepath.Join(t.TempDir(), "listener"), sock: filepath.Join(sockDir, "admin.sock"), endpoint: c.LocalAddr().String()}
	c.Close()
	if p := runBin(t, runOpts{}, "stratum-listener", "init", "--data", s.data, "--light-ksf", "--endpoint", s.endpoint); p.exit != 0 {
		t.Fatalf("init: %d %s", p.exit, p.stderr)
	}
	cmd := exec.Command(filepath.Join(binDir, "stratum-listener"), "serve", "--data", s.data, "--listen", s.endpoint, "--admin-socket", s.sock)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		if p := s.admin(t, "ca", "show"); p.exit == 0 {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("listener did not come up: %s", stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (s *server) admin(t *testing.T, args ...string) proc {
	return runBin(t, runOpts{}, "stratum-listener", append([]string{"--admin-socket", s.sock}, args...)...)
}

// mint returns a fresh code and its id.
func (s *server) mint(t *testing.T) (code, id string) {
	t.Helper()
	p := s.admin(t, "codes", "create", "--json", "--auto-approve", "--max-uses", "1")
	if p.exit != 0 {
		t.Fatalf("codes create: %d %s", p.exit, p.stderr)
	}
	var c struct{ ID, Code string }
	if err := json.Unmarshal([]byte(p.stdout), &c); err != nil {
		t.Fatal(err)
	}
	return c.Code, c.ID
}

// restartPrevented is the unit's RestartPreventExitStatus= as numbers.
func restartPrevented(t *testing.T, unitName string) []int {
	t.Helper()
	opts, err := unit.DeserializeOptions(bytes.NewReader(systemd.UnitFiles()[unitName]))
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, o := range opts {
		if o.Section == "Service" && o.Name == "RestartPreventExitStatus" {
			for _, f := range strings.Fields(o.Value) {
				n, err := strconv.Atoi(f)
				if err != nil {
					t.Fatalf("%s: RestartPreventExitStatus=%s", unitName, o.Value)
				}
				out = append(out, n)
			}
		}
	}
	return out
}

// TestExitContract is the exit contract as a table over both binaries.
// Each row runs a real process and checks its status and that its message
// says what to do; rows marked unit also check that the unit running that
// command does (or does not) restart on that status.
func TestExitContract(t *testing.T) {
	srv := startServer(t)
	root := os.Geteuid() == 0
	// rows that run as nobody exec the binaries from there
	if err := os.Chmod(binDir, 0o755); err != nil {
		t.Fatal(err)
	}

	tmp := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(tmp, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good, _ := srv.mint(t)
	revokedCode, revokedID := srv.mint(t)
	if p := srv.admin(t, "codes", "revoke", revokedID); p.exit != 0 {
		t.Fatalf("revoke: %s", p.stderr)
	}
	wrong, err := joincode.NewCode("ZZ") // valid check symbol, never minted
	if err != nil {
		t.Fatal(err)
	}
	// two adjacent, different symbols swapped: the check symbol catches it
	// (swapping two equal ones would leave the code as it is)
	typo := []byte(good)
	for i := 0; i+1 < len(typo); i++ {
		if typo[i] != typo[i+1] && typo[i] != '-' && typo[i+1] != '-' {
			typo[i], typo[i+1] = typo[i+1], typo[i]
			break
		}
	}
	goodFile := write("good", good+"\n")
	wrongFile := write("wrong", wrong.Display()+"\n")
	typoFile := write("typo", string(typo)+"\n")
	revokedFile := write("revoked", revokedCode+"\n")
	uninit := filepath.Join(tmp, "never-initialised")
	if err := os.Mkdir(uninit, 0o700); err != nil {
		t.Fatal(err)
	}
	state := func() string { return filepath.Join(t.TempDir(), "state") }
	// a state directory this process may not create: a read-only parent,
	// or (as root, which ignores modes) a run as nobody
	lockedState := filepath.Join(tmp, "locked", "state")
	if err := os.Mkdir(filepath.Join(tmp, "locked"), 0o500); err != nil {
		t.Fatal(err)
	}
	missingSock := filepath.Join(tmp, "no-such.sock")
	unreachable := "127.0.0.1:1" // a closed UDP port: the dial times out

	type row struct {
		name string
		bin  string
		args []string
		opts runOpts
		want int
		// say: substrings the stderr must hold; never: ones it must not
		say, never []string
		// unit: the unit that runs this command; its restart policy must
		// match the status (no restart for 1 and 2)
		unit string
	}
	rows := []row{
		// --- usage (2) ---
		{name: "agent unknown command", bin: "stratum-agent", args: []string{"jion"}, want: 2, say: []string{`unknown command "jion"`, `did you mean "join"`}},
		{name: "agent unknown flag", bin: "stratum-agent", args: []string{"join", "--endpiont", "x"}, want: 2, say: []string{"--endpiont"}},
		{name: "agent dial timeout not a duration", bin: "stratum-agent", args: []string{"join", "--endpoint", unreachable, "--dial-timeout", "soon", "--code-file", goodFile, "--state", state()}, want: 2, say: []string{"--dial-timeout"}},
		{name: "agent dial timeout not positive", bin: "stratum-agent", args: []string{"join", "--endpoint", unreachable, "--dial-timeout", "0s", "--code-file", goodFile, "--state", state()}, want: 2, say: []string{"--dial-timeout must be positive"}},
		{name: "agent extra argument", bin: "stratum-agent", args: []string{"status", "extra"}, want: 2},
		{name: "agent join without endpoint", bin: "stratum-agent", args: []string{"join", "--code-file", goodFile, "--state", state()}, want: 2, say: []string{"--endpoint"}},
		{name: "agent run without endpoint", bin: "stratum-agent", args: []string{"run", "--code-file", goodFile, "--state", state()}, want: 2, say: []string{"--endpoint"}, unit: "stratum-agent.service"},
		{name: "agent join bad port", bin: "stratum-agent", args: []string{"join", "--endpoint", "join.example:99999", "--code-file", goodFile, "--state", state()}, want: 2, say: []string{"--endpoint"}},
		{name: "agent join bad fingerprint", bin: "stratum-agent", args: []string{"join", "--endpoint", srv.endpoint, "--ca-fingerprint", "AA:BB", "--code-file", goodFile, "--state", state()}, want: 2, say: []string{"--ca-fingerprint"}},
		{name: "agent run bad fingerprint", bin: "stratum-agent", args: []string{"run", "--endpoint", srv.endpoint, "--ca-fingerprint", "AA:BB", "--code-file", goodFile, "--state", state()}, want: 2, say: []string{"--ca-fingerprint"}, unit: "stratum-agent.service"},
		{name: "agent run bad fingerprint from env", bin: "stratum-agent", args: []string{"run", "--code-file", goodFile, "--state", state()}, opts: runOpts{env: []string{"STRATUM_ENDPOINT=" + srv.endpoint, "STRATUM_CA_FINGERPRINT=AA:BB"}}, want: 2, say: []string{"--ca-fingerprint"}, unit: "stratum-agent.service"},
		{name: "agent run bad log level", bin: "stratum-agent", args: []string{"run", "--endpoint", srv.endpoint, "--log-level", "loud", "--state", state()}, want: 2, say: []string{"--log-level"}, unit: "stratum-agent.service"},
		{name: "agent code with a typo", bin: "stratum-agent", args: []string{"join", "--endpoint", srv.endpoint, "--code-file", typoFile, "--state", state()}, want: 2},
		{name: "agent no code off a terminal", bin: "stratum-agent", args: []string{"join", "--endpoint", srv.endpoint, "--state", state()}, want: 2, say: []string{"--code-file"}},
		{name: "agent state dir not writable", bin: "stratum-agent", args: []string{"join", "--endpoint", unreachable, "--code", "-", "--state", lockedState}, opts: runOpts{stdin: good + "\n", nobody: root}, want: 2, say: []string{"permission denied", "run as root"}},
		{name: "agent run state dir not writable", bin: "stratum-agent", args: []string{"run", "--endpoint", unreachable, "--code-file", "/dev/stdin", "--state", lockedState}, opts: runOpts{stdin: good + "\n", nobody: root}, want: 2, say: []string{"permission denied"}, unit: "stratum-agent.service"},
		{name: "listener unknown command", bin: "stratum-listener", args: []string{"cdoes"}, want: 2, say: []string{`unknown command "cdoes"`, `did you mean "codes"`}},
		{name: "listener unknown subcommand", bin: "stratum-listener", args: []string{"codes", "creat"}, want: 2, say: []string{`unknown command "creat"`, `did you mean "create"`}, never: []string{"Usage:"}},
		{name: "listener unknown flag", bin: "stratum-listener", args: []string{"codes", "create", "--tll", "1h"}, want: 2, say: []string{"--tll"}},
		{name: "listener bad duration", bin: "stratum-listener", args: []string{"--admin-socket", srv.sock, "codes", "create", "--ttl", "1x"}, want: 2, say: []string{"--ttl"}},
		{name: "listener pin the API refuses, in flag terms", bin: "stratum-listener", args: []string{"--admin-socket", srv.sock, "codes", "create", "--expect-mac", "00:00:00:00:00:00"}, want: 2, say: []string{"--expect-mac:"}, never: []string{"expect.mac"}},
		{name: "listener show without id", bin: "stratum-listener", args: []string{"codes", "show"}, want: 2},
		{name: "listener init bad endpoint", bin: "stratum-listener", args: []string{"init", "--data", filepath.Join(tmp, "bad-ep"), "--endpoint", "join.example:0"}, want: 2, say: []string{"--endpoint"}},
		{name: "listener serve without data", bin: "stratum-listener", args: []string{"serve"}, want: 2, say: []string{"--data"}, unit: "stratum-listener.service"},
		{name: "listener serve never initialised", bin: "stratum-listener", args: []string{"serve", "--data", uninit, "--listen", "127.0.0.1:0", "--admin-socket", filepath.Join(tmp, "u.sock")}, want: 2, say: []string{"not initialized", "stratum-listener init"}, unit: "stratum-listener.service"},
		{name: "listener serve bad log level", bin: "stratum-listener", args: []string{"serve", "--data", srv.data, "--log-level", "loud"}, want: 2, say: []string{"--log-level"}, unit: "stratum-listener.service"},
		{name: "listener bad log level from env", bin: "stratum-listener", args: []string{"serve", "--data", srv.data}, opts: runOpts{env: []string{"STRATUM_LOG_LEVEL=loud"}}, want: 2, say: []string{"STRATUM_LOG_LEVEL", "--log-level"}, unit: "stratum-listener.service"},
		{name: "listener bad duration from env", bin: "stratum-listener", args: []string{"--admin-socket", srv.sock, "codes", "create"}, opts: runOpts{env: []string{"STRATUM_TTL=1x"}}, want: 2, say: []string{"STRATUM_TTL", "--ttl"}},
		{name: "listener data dir from env, never initialised", bin: "stratum-listener", args: []string{"serve", "--listen", "127.0.0.1:0", "--admin-socket", filepath.Join(tmp, "u2.sock")}, opts: runOpts{env: []string{"STRATUM_DATA=" + uninit}}, want: 2, say: []string{uninit, "not initialized"}, unit: "stratum-listener.service"},
		{name: "listener admin socket not root's", bin: "stratum-listener", args: []string{"--admin-socket", srv.sock, "codes", "list"}, opts: runOpts{nobody: true}, want: 2, say: []string{srv.sock, "permission denied", "root"}, never: []string{"http://"}},

		// --- refused for good (1) ---
		{name: "agent wrong code", bin: "stratum-agent", args: []string{"join", "--endpoint", srv.endpoint, "--code-file", wrongFile, "--state", state()}, want: 1, say: []string{"code not accepted"}},
		{name: "agent revoked code", bin: "stratum-agent", args: []string{"join", "--endpoint", srv.endpoint, "--code-file", revokedFile, "--state", state()}, want: 1, say: []string{"revoked"}},
		{name: "agent run wrong code", bin: "stratum-agent", args: []string{"run", "--endpoint", srv.endpoint, "--code-file", wrongFile, "--state", state()}, want: 1, unit: "stratum-agent.service"},
		{name: "agent status not joined", bin: "stratum-agent", args: []string{"status", "--state", state()}, want: 1},
		{name: "listener init twice", bin: "stratum-listener", args: []string{"init", "--data", srv.data}, want: 1, say: []string{"already initialized"}},
		{name: "listener unknown code", bin: "stratum-listener", args: []string{"--admin-socket", srv.sock, "codes", "show", "nosuchcode"}, want: 1},

		// --- transient (3) ---
		{name: "agent unreachable, default port", bin: "stratum-agent", args: []string{"join", "--code-file", goodFile, "--state", state()}, opts: runOpts{env: []string{"STRATUM_ENDPOINT=127.0.0.2"}}, want: 3, say: []string{"127.0.0.2:9444", "could not reach"}},
		{name: "agent unreachable", bin: "stratum-agent", args: []string{"join", "--endpoint", unreachable, "--dial-timeout", "2s", "--code-file", goodFile, "--state", state()}, want: 3, say: []string{unreachable}},
		{name: "listener not running", bin: "stratum-listener", args: []string{"--admin-socket", missingSock, "codes", "list"}, want: 3, say: []string{missingSock, "no listener is running"}, never: []string{"http://"}},
		{name: "listener not running, from env", bin: "stratum-listener", args: []string{"nodes", "list"}, opts: runOpts{env: []string{"STRATUM_ADMIN_SOCKET=" + missingSock}}, want: 3, say: []string{missingSock}},

		// --- done (0) ---
		{name: "agent joins", bin: "stratum-agent", args: []string{"join", "--endpoint", srv.endpoint, "--code-file", goodFile, "--state", state()}, want: 0},
		{name: "listener group alone prints help", bin: "stratum-listener", args: []string{"codes"}, want: 0},
		{name: "listener codes list", bin: "stratum-listener", args: []string{"--admin-socket", srv.sock, "codes", "list"}, want: 0},
		{name: "listener codes list, flag from env", bin: "stratum-listener", args: []string{"codes", "list", "--all"}, opts: runOpts{env: []string{"STRATUM_ADMIN_SOCKET=/nonexistent", "STRATUM_ADMIN_SOCKET=" + srv.sock}}, want: 0},
		{name: "listener command line beats env", bin: "stratum-listener", args: []string{"--admin-socket", missingSock, "codes", "list"}, opts: runOpts{env: []string{"STRATUM_ADMIN_SOCKET=" + srv.sock}}, want: 3, say: []string{missingSock}},
		{name: "listener version", bin: "stratum-listener", args: []string{"--version"}, want: 0},
		{name: "agent version", bin: "stratum-agent", args: []string{"version", "--json"}, want: 0},
	}
	prevent := map[string][]int{
		"stratum-agent.service":    restartPrevented(t, "stratum-agent.service"),
		"stratum-listener.service": restartPrevented(t, "stratum-listener.service"),
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			if r.opts.nobody && !root {
				if strings.Contains(r.name, "socket") {
					// the socket is ours: only another user is refused
					testenv.NeedRoot(t, "run a client as another user")
				}
				// the read-only parent refuses us as it refuses nobody
				r.opts.nobody = false
			}
			t.Parallel()
			p := runBin(t, r.opts, r.bin, r.args...)
			if p.exit != r.want {
				t.Errorf("%s %s: exit %d, want %d\nstderr: %s", r.bin, strings.Join(r.args, " "), p.exit, r.want, p.stderr)
			}
			for _, s := range r.say {
				if !strings.Contains(p.stderr, s) {
					t.Errorf("stderr does not say %q:\n%s", s, p.stderr)
				}
			}
			for _, s := range r.never {
				if strings.Contains(p.stderr, s) {
					t.Errorf("stderr says %q:\n%s", s, p.stderr)
				}
			}
			if r.unit != "" {
				kept := slices.Contains(prevent[r.unit], p.exit)
				if wantKept := p.exit == 1 || p.exit == 2; kept != wantKept {
					t.Errorf("%s restarts on exit %d: %v, want %v (RestartPreventExitStatus=%v)", r.unit, p.exit, !kept, !wantKept, prevent[r.unit])
				}
			}
		})
	}
}

// TestDefaultPort: an endpoint without a port means 9444, for init as for
// the agent (the agent's row is in TestExitContract).
func TestDefaultPort(t *testing.T) {
	data := filepath.Join(t.TempDir(), "l")
	if p := runBin(t, runOpts{}, "stratum-listener", "init", "--data", data, "--light-ksf", "--endpoint", "join.example", "--endpoint", "[2001:db8::1]"); p.exit != 0 {
		t.Fatalf("init: %d %s", p.exit, p.stderr)
	}
	b, err := os.ReadFile(filepath.Join(data, "listener.json"))
	if err != nil {
		t.Fatal(err)
	}
	var s struct{ Endpoints []string }
	if err := json.NewDecoder(bufio.NewReader(bytes.NewReader(b))).Decode(&s); err != nil {
		t.Fatal(err)
	}
	if want := []string{"join.example:9444", "[2001:db8::1]:9444"}; !slices.Equal(s.Endpoints, want) {
		t.Errorf("endpoints %q, want %q", s.Endpoints, want)
	}
}

// TestDay2 runs the day-2 commands against a live listener: `stratum-agent
// renew --now`, and `events --since/--type`.
func TestDay2(t *testing.T) {
	srv := startServer(t)
	code, _ := srv.mint(t)
	state := filepath.Join(t.TempDir(), "state")
	if p := runBin(t, runOpts{stdin: code + "\n"}, "stratum-agent", "join", "--endpoint", srv.endpoint, "--code", "-", "--state", state); p.exit != 0 {
		t.Fatalf("join: %d %s", p.exit, p.stderr)
	}
	if p := runBin(t, runOpts{}, "stratum-agent", "renew", "--state", state); p.exit != 2 || !strings.Contains(p.stderr, "--now") {
		t.Errorf("renew without --now: %d %s", p.exit, p.stderr)
	}
	p := runBin(t, runOpts{}, "stratum-agent", "renew", "--now", "--state", state)
	if p.exit != 0 || !strings.Contains(p.stdout, "renewed node-") {
		t.Fatalf("renew --now: %d %s %s", p.exit, p.stdout, p.stderr)
	}
	if p := runBin(t, runOpts{}, "stratum-agent", "renew", "--now", "--state", filepath.Join(t.TempDir(), "none")); p.exit != 1 || !strings.Contains(p.stderr, "not joined") {
		t.Errorf("renew --now not joined: %d %s", p.exit, p.stderr)
	}

	// nodes list: filters, and times relative to now for people
	if p := srv.admin(t, "nodes", "list"); p.exit != 0 || !strings.Contains(p.stdout, "in 6d23h") {
		t.Errorf("nodes list: %d %s %s", p.exit, p.stdout, p.stderr)
	}
	for filter, want := range map[string]int{"--state=active": 1, "--state=revoked": 0, "--role=nosuch": 0, "--pool=default": 1} {
		p := srv.admin(t, "nodes", "list", filter, "--json")
		var out struct{ Items []json.RawMessage }
		if err := json.Unmarshal([]byte(p.stdout), &out); err != nil || len(out.Items) != want {
			t.Errorf("nodes list %s: %d items, want %d (%v) %s", filter, len(out.Items), want, err, p.stderr)
		}
	}

	types := func(args ...string) []string {
		t.Helper()
		p := srv.admin(t, append([]string{"events", "--json"}, args...)...)
		if p.exit != 0 {
			t.Fatalf("events %v: %d %s", args, p.exit, p.stderr)
		}
		var out []string
		for _, line := range strings.Split(strings.TrimSpace(p.stdout), "\n") {
			if line == "" {
				continue
			}
			var ev struct{ Type string }
			if err := json.Unmarshal([]byte(line), &ev); err != nil {
				t.Fatalf("%v: %s", err, line)
			}
			out = append(out, ev.Type)
		}
		return out
	}
	if got := types("--type", "node"); !slices.Equal(got, []string{"node.joined", "node.renewed"}) {
		t.Errorf("--type node: %v", got)
	}
	if got := types("--type", "node.joined"); !slices.Equal(got, []string{"node.joined"}) {
		t.Errorf("--type node.joined: %v", got)
	}
	if got := types("--since", "1h"); len(got) < 3 {
		t.Errorf("--since 1h: %v", got)
	}
	if got := types("--since", time.Now().Add(time.Hour).UTC().Format(time.RFC3339)); len(got) != 0 {
		t.Errorf("--since an hour ahead: %v", got)
	}
	if p := srv.admin(t, "events", "--since", "yesterday"); p.exit != 2 || !strings.Contains(p.stderr, "--since") {
		t.Errorf("--since yesterday: %d %s", p.exit, p.stderr)
	}
}
