package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stratumjoin/stratum/internal/joincode"
	"github.com/stratumjoin/stratum/internal/store/etcdtest"
)

// slowListener is a listener whose codes use the default key stretching
// (Argon2id t=3, 64 MiB), so that agents spend a while between the count
// of their attempt and their proof: the window a crash falls into.
func slowListener(t *testing.T) *listenerProc {
	t.Helper()
	sockDir, err := os.MkdirTemp("/tmp", "sje2e")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	// the holders all come from one address: lift its budget of unproven
	// starts, which ten attempts in flight at once would exceed
	p := &listenerProc{t: t, data: filepath.Join(t.TempDir(), "listener"), sock: filepath.Join(sockDir, "admin.sock"), endpoint: freeUDP(t), serveArgs: []string{"--unproven-per-source=-1"}}
	run(t, nil, "stratum-listener", "init", "--data", p.data, "--endpoint", p.endpoint, "--code-ksf", slowKSF)
	p.start()
	t.Cleanup(p.stop)
	return p
}

// slowKSF stretches the crash tests' codes far beyond the default, so that
// each holder spends a second or so between its counted Hello and its
// Proof: long enough to catch ten attempts counted and in flight at once.
const slowKSF = "8,65536,1"

// agentProc is a `stratum-agent join` process.
type agentProc struct {
	cmd            *exec.Cmd
	stdout, stderr bytes.Buffer
	done           chan struct{}
	exit           int
}

// machineRoot makes a filesystem root whose DMI names machine i, so
// agents on one host join as distinct machines.
func machineRoot(t *testing.T, dir string, i int) string {
	t.Helper()
	root := filepath.Join(dir, "root", fmt.Sprint(i))
	id := filepath.Join(root, "sys", "class", "dmi", "id")
	if err := os.MkdirAll(id, 0o755); err != nil {
		t.Fatal(err)
	}
	uuid := fmt.Sprintf("4c4c4544-0000-4000-8000-%012d\n", 1000+i)
	if err := os.WriteFile(filepath.Join(id, "product_uuid"), []byte(uuid), 0o644); err != nil {
		t.Fatal(err)
	}
	return root
}

func startAgent(t *testing.T, endpoint, code, state, root string) *agentProc {
	t.Helper()
	a := &agentProc{done: make(chan struct{})}
	a.cmd = exec.Command(filepath.Join(binDir, "stratum-agent"), "join", "--endpoint", endpoint, "--code", "-", "--state", state, "--root", root)
	a.cmd.Stdin = strings.NewReader(code + "\n")
	a.cmd.Stdout, a.cmd.Stderr = &a.stdout, &a.stderr
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		err := a.cmd.Wait()
		if ee, ok := err.(*exec.ExitError); ok {
			a.exit = ee.ExitCode()
		} else if err != nil {
			a.exit = -1
		}
		close(a.done)
	}()
	t.Cleanup(func() {
		a.cmd.Process.Kill()
		<-a.done
	})
	return a
}

func (p *listenerProc) code(id string) mintedCode {
	p.t.Helper()
	var c mintedCode
	p.adminJSON(&c, "codes", "show", id)
	return c
}

// TestKill9WithHonestAttemptsInFlight: twelve holders of a 50-use code;
// the listener is killed with SIGKILL while ten of their attempts are
// counted and in flight (the agents are frozen right then, so none can
// finish), and restarted. The agents, run again with their state
// directories, resume those attempts: all twelve join, the code's failed
// count is 0 and it is not burned. Before attempts could resume, the
// eleventh start after the leases ran out burned the code.
func TestKill9WithHonestAttemptsInFlight(t *testing.T) {
	honestCrash(t, []*listenerProc{slowListener(t)})
}

// TestKill9EveryEtcdListenerWithHonestAttemptsInFlight is the same with
// two listeners sharing three etcd processes, both killed.
func TestKill9EveryEtcdListenerWithHonestAttemptsInFlight(t *testing.T) {
	procs := etcdtest.StartProcs(t, 3)
	var eps []string
	for _, m := range procs.Members {
		eps = append(eps, strings.TrimPrefix(m.ClientURL, "http://"))
	}
	storeURL := "etcd://" + strings.Join(eps, ",") + "/stratum-kill"
	data := filepath.Join(t.TempDir(), "listener")
	var ls []*listenerProc
	for i := range 2 {
		sockDir, err := os.MkdirTemp("/tmp", "sje2e")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(sockDir) })
		p := &listenerProc{t: t, data: data, sock: filepath.Join(sockDir, "admin.sock"), endpoint: freeUDP(t), serveArgs: []string{"--store", storeURL, "--unproven-per-source=-1"}}
		if i == 0 { // slow key stretching: agents take a while to prove
			run(t, nil, "stratum-listener", "init", "--data", data, "--endpoint", p.endpoint, "--code-ksf", slowKSF)
		}
		p.start()
		t.Cleanup(p.stop)
		ls = append(ls, p)
	}
	honestCrash(t, ls)
}

// honestCrash starts twelve holders spread over the listeners, freezes
// them once ten attempts are counted, kills every listener with SIGKILL,
// restarts them after 2 s and lets the holders finish.
func honestCrash(t *testing.T, ls []*listenerProc) {
	l := ls[0]
	var code mintedCode
	l.adminJSON(&code, "codes", "create", "--auto-approve", "--max-uses", "50")
	dir := t.TempDir()
	state := func(i int) string { return filepath.Join(dir, "holder", string(rune('a'+i))) }
	endpoint := func(i int) string { return ls[i%len(ls)].endpoint }

	var agents []*agentProc
	for i := range 12 {
		agents = append(agents, startAgent(t, endpoint(i), code.Code, state(i), machineRoot(t, dir, i)))
	}
	// wait until ten attempts are counted, then freeze every agent
	deadline := time.Now().Add(60 * time.Second)
	for l.code(code.ID).FailedAttempts < 10 {
		if time.Now().After(deadline) {
			t.Fatalf("ten attempts never counted at once: %+v", l.code(code.ID))
		}
		time.Sleep(5 * time.Millisecond)
	}
	for _, a := range agents {
		a.cmd.Process.Signal(syscall.SIGSTOP)
	}
	inFlight := l.code(code.ID)
	t.Logf("at the kill: %d attempts counted, %d uses", inFlight.FailedAttempts, inFlight.Uses)
	for _, p := range ls {
		p.kill()
	}
	time.Sleep(2 * time.Second) // restarted after 2 s, as in the report
	for _, p := range ls {
		p.start()
	}
	for _, a := range agents {
		a.cmd.Process.Signal(syscall.SIGCONT)
	}
	// Each holder whose connection died with the listener runs again, as
	// the service would, all at once: a holder that was not counted waits
	// for the leases of those that were, which only their return ends.
	var wg sync.WaitGroup
	for i, a := range agents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-a.done
			if a.exit == 0 {
				return
			}
			r := agentJoin(context.Background(), endpoint(i), code.Code, state(i), "--root", machineRoot(t, dir, i))
			if r.exit != 0 {
				t.Errorf("holder %d after the restart: exit %d\n%s", i, r.exit, r.stderr)
			}
		}()
	}
	wg.Wait()
	got := l.code(code.ID)
	if got.Uses != 12 || got.FailedAttempts != 0 || got.State != "live" || got.RevokedBy != "" {
		t.Fatalf("after the restart: %+v; want 12 uses, 0 failed attempts, live", got)
	}
}

// TestKill9GuessersStayCounted is the converse: ten guessers that drop
// after KE2, a SIGKILL and a restart; their ten attempts stay counted,
// and the eleventh guess burns the code.
func TestKill9GuessersStayCounted(t *testing.T) {
	// the guessers all come from one address: lift its budget
	l := newListenerServe(t, []string{"--unproven-per-source=-1"})
	var code mintedCode
	l.adminJSON(&code, "codes", "create", "--auto-approve", "--max-uses", "0")
	sec, err := joincode.Parse(code.Code)
	if err != nil {
		t.Fatal(err)
	}
	wrong := func() string {
		var w joincode.Secret
		for w.Locator == "" || string(w.Password()) == string(sec.Password()) {
			w, _ = joincode.NewCode(sec.Locator)
		}
		return w.Display()
	}
	dir := t.TempDir()
	ctx := context.Background()
	for i := range 10 {
		if r := agentJoin(ctx, l.endpoint, wrong(), filepath.Join(dir, "guesser", string(rune('a'+i)))); r.exit != 1 {
			t.Fatalf("guess %d: %+v", i, r)
		}
	}
	if got := l.code(code.ID); got.FailedAttempts != 10 {
		t.Fatalf("%d attempts counted after ten guesses", got.FailedAttempts)
	}
	l.kill()
	l.start()
	if got := l.code(code.ID); got.FailedAttempts != 10 || got.State != "live" {
		t.Fatalf("after the restart: %+v", got)
	}
	if r := agentJoin(ctx, l.endpoint, wrong(), filepath.Join(dir, "guesser", "k")); r.exit != 1 {
		t.Fatalf("11th guess: %+v", r)
	}
	if got := l.code(code.ID); got.State != "revoked" || got.RevokedBy != "system:too-many-attempts" {
		t.Fatalf("after the 11th guess: %+v, want burned", got)
	}
	r := agentJoin(ctx, l.endpoint, code.Code, filepath.Join(dir, "holder"))
	if r.exit != 1 || !strings.Contains(r.stderr, "burned") {
		t.Fatalf("holder after the burn: %+v", r)
	}
}

// TestDamagedStateFileRefused: a zero-length, a truncated and a
// bit-flipped state.db stop `serve` with a message that names the file
// and the recovery, and never a panic.
func TestDamagedStateFileRefused(t *testing.T) {
	l := newListener(t)
	var code mintedCode
	for range 20 { // enough records for data pages
		l.adminJSON(&code, "codes", "create", "--auto-approve", "--max-uses", "1")
	}
	l.stop()
	db := filepath.Join(l.data, "state.db")
	good, err := os.ReadFile(db)
	if err != nil {
		t.Fatal(err)
	}
	flipped := bytes.Clone(good)
	for off := 2 * 4096; off+4096 <= len(flipped); off += 4096 {
		for i := off + 16; i < off+4096; i += 7 {
			flipped[i] ^= 0xa5
		}
	}
	for name, content := range map[string][]byte{
		"zero length": {},
		"truncated":   good[:len(good)/3],
		"bit-flipped": flipped,
	} {
		t.Run(name, func(t *testing.T) {
			if err := os.WriteFile(db, content, 0o600); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(filepath.Join(binDir, "stratum-listener"), "serve", "--data", l.data, "--listen", l.endpoint, "--admin-socket", l.sock)
			out, err := cmd.CombinedOutput()
			ee, ok := err.(*exec.ExitError)
			if !ok || ee.ExitCode() != 1 {
				t.Fatalf("serve on a damaged file: %v\n%s", err, out)
			}
			for _, want := range []string{db, "store restore"} {
				if !strings.Contains(string(out), want) {
					t.Errorf("message lacks %q:\n%s", want, out)
				}
			}
			if strings.Contains(string(out), "panic") || strings.Contains(string(out), "goroutine ") {
				t.Errorf("serve panicked:\n%s", out)
			}
		})
	}
}
