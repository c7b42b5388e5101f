package service

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"golang.org/x/sys/unix"

	"github.com/stratumjoin/stratum/internal/joincode"
	"github.com/stratumjoin/stratum/internal/testenv"
	"github.com/stratumjoin/stratum/internal/wire"
)

// helperEnv makes the test binary a stand-in process that holds a code
// without the agent's protection: the positive control.
const helperEnv = "STRATUM_COREDUMP_HELPER"

func init() {
	if file := os.Getenv(helperEnv); file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			os.Exit(9)
		}
		sec, err := joincode.Parse(string(b))
		if err != nil {
			os.Exit(9)
		}
		held := sec.Password()
		fmt.Println("holding", len(held))
		time.Sleep(time.Minute) // the child holds the secret until the test kills it for its core
		fmt.Println(len(held))
		os.Exit(0)
	}
}

// corePattern makes cores land as "core*" in the crashing process's
// working directory while the test runs, and restores the system's
// setting after.
func corePattern(t *testing.T) {
	t.Helper()
	const file = "/proc/sys/kernel/core_pattern"
	old, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("read %s: %v", file, err)
	}
	if p := strings.TrimSpace(string(old)); p == "core" || (!strings.HasPrefix(p, "|") && !strings.Contains(p, "/")) {
		return
	}
	if err := os.WriteFile(file, []byte("core"), 0o644); err != nil {
		t.Fatalf("core_pattern is %q and cannot be set for this test (run as root, as CI does): %v", old, err)
	}
	t.Cleanup(func() {
		if err := os.WriteFile(file, old, 0o644); err != nil {
			t.Errorf("restore %s to %q: %v", file, old, err)
		}
	})
}

// allowCores lifts this process's core size limit so that its children
// inherit a limit that allows cores; the old one comes back after.
func allowCores(t *testing.T) {
	t.Helper()
	var old unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_CORE, &old); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setrlimit(unix.RLIMIT_CORE, &unix.Rlimit{Cur: unix.RLIM_INFINITY, Max: unix.RLIM_INFINITY}); err != nil {
		t.Fatalf("lift RLIMIT_CORE (run as root, as CI does): %v", err)
	}
	t.Cleanup(func() { _ = unix.Setrlimit(unix.RLIMIT_CORE, &old) })
}

// codeForms is every form of the code a memory dump could hold.
func codeForms(sec joincode.Secret) [][]byte {
	disp, pw := sec.Display(), string(sec.Password())
	var out [][]byte
	for _, s := range []string{disp, pw, pw[:joincode.CodeSymbols], disp[:11]} {
		out = append(out, []byte(s), []byte(strings.ToLower(s)))
	}
	return out
}

// coreHolds reports whether any core file in dir holds one of forms.
func coreHolds(t *testing.T, dir string, forms [][]byte) (cores int, found string) {
	t.Helper()
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), "core") {
			continue
		}
		cores++
		f, err := os.Open(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 1<<20)
		var tail []byte
		for found == "" {
			n, err := f.Read(buf)
			chunk := append(tail, buf[:n]...)
			for _, form := range forms {
				if bytes.Contains(chunk, form) {
					found = string(form)
				}
			}
			if len(chunk) > 64 {
				tail = append([]byte(nil), chunk[len(chunk)-64:]...)
			}
			if err != nil {
				break
			}
		}
		f.Close()
		os.Remove(filepath.Join(dir, e.Name())) // never leave a core behind
	}
	return cores, found
}

// stallingListener accepts QUIC join connections, reads the Hello and
// never answers: the agent is left holding its code.
func stallingListener(t *testing.T) (endpoint string, hellos <-chan struct{}) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "stall"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := quic.ListenAddr("127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}, NextProtos: []string{wire.ALPNJoin}},
		&quic.Config{MaxIdleTimeout: time.Minute, KeepAlivePeriod: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	ch := make(chan struct{}, 8)
	go func() {
		for {
			conn, err := ln.Accept(context.Background())
			if err != nil {
				return
			}
			go func() {
				str, err := conn.AcceptStream(context.Background())
				if err != nil {
					return
				}
				var h wire.Hello
				if wire.Read(str, &h) == nil {
					ch <- struct{}{}
				}
				_, _ = io.Copy(io.Discard, str)
			}()
		}
	}()
	return ln.Addr().String(), ch
}

// abort sends SIGABRT and waits for the process to die of it.
func abort(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	if err := cmd.Process.Signal(syscall.SIGABRT); err != nil {
		t.Fatal(err)
	}
	err := cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("the process did not die of SIGABRT: %v", err)
	}
}

// TestAgentCoreHoldsNoCode: an agent killed with SIGABRT under
// GOTRACEBACK=crash while it holds a code (mid-join, against a listener
// that stalls after the Hello) leaves no core with any form of the code.
// The control, a process holding the same code without the protection
// under the same settings, does dump a core that holds it, so the check
// would see a leak.
func TestAgentCoreHoldsNoCode(t *testing.T) {
	testenv.NeedRoot(t, "set the core size limit and core_pattern")
	corePattern(t)
	allowCores(t)
	sec, err := joincode.NewCode("7Q")
	if err != nil {
		t.Fatal(err)
	}
	forms := codeForms(sec)
	codeFile := filepath.Join(t.TempDir(), "join-code")
	if err := os.WriteFile(codeFile, []byte(sec.Display()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	// the control: same code, same limits, no protection
	ctlDir := t.TempDir()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctl := exec.Command(self, "-test.run=^$")
	ctl.Dir = ctlDir
	ctl.Env = append(os.Environ(), helperEnv+"="+codeFile, "GOTRACEBACK=crash")
	out, err := ctl.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := ctl.Start(); err != nil {
		t.Fatal(err)
	}
	line := make([]byte, 64)
	if n, err := out.Read(line); err != nil || !strings.HasPrefix(string(line[:n]), "holding") {
		t.Fatalf("control did not start: %q %v", line[:n], err)
	}
	abort(t, ctl)
	cores, found := coreHolds(t, ctlDir, forms)
	if cores == 0 || found == "" {
		t.Fatalf("the control wrote %d cores, holding the code: %v; the check could not see a leak", cores, found != "")
	}

	// the agent, mid-join
	endpoint, hellos := stallingListener(t)
	agentDir := t.TempDir()
	var stderr bytes.Buffer
	ag := exec.Command(bin("stratum-agent"), "join", "--endpoint", endpoint, "--code-file", codeFile, "--state", filepath.Join(agentDir, "state"), "--root", t.TempDir())
	ag.Dir = agentDir
	ag.Env = append(os.Environ(), "GOTRACEBACK=crash")
	ag.Stderr = &stderr
	if err := ag.Start(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-hellos:
	case <-time.After(60 * time.Second):
		_ = ag.Process.Kill()
		t.Fatalf("the agent never sent its Hello:\n%s", stderr.String())
	}
	abort(t, ag)
	cores, found = coreHolds(t, agentDir, forms)
	if found != "" {
		t.Fatalf("the agent's core holds the code")
	}
	if !strings.Contains(stderr.String(), "SIGABRT") {
		t.Fatalf("the agent did not crash with a traceback:\n%s", stderr.String())
	}
	for _, form := range forms {
		if bytes.Contains(stderr.Bytes(), form) {
			t.Fatal("the agent's traceback holds the code")
		}
	}
	t.Logf("control: a core holding the code; agent: %d cores, none holding it", cores)
}
