// Package testenv says what a test needs from the machine (root, a system
// tool) and decides what happens when it is missing: under `go test -short`
// (make test-short, an ordinary user's laptop) the test is skipped; in the
// full run (make test, CI as root) it fails, naming what to install, so a
// missing tool can never pass CI as a silent skip. It also hands out the
// loopback ports the suites that start listener processes bind.
package testenv

import (
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// NeedRoot stops t unless it runs as root.
func NeedRoot(t testing.TB, why string) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if testing.Short() {
		t.Skipf("needs root to %s; make test (as root) runs it", why)
	}
	t.Fatalf("must run as root to %s (uid %d); CI runs the tests as root, or use make test-short", why, os.Geteuid())
}

// NeedTool returns the path of tool, or stops t naming the Debian package
// that provides it.
func NeedTool(t testing.TB, tool, debianPackage string) string {
	t.Helper()
	path, err := exec.LookPath(tool)
	if err == nil {
		return path
	}
	if testing.Short() {
		t.Skipf("%s not found; make test needs it (apt-get install %s)", tool, debianPackage)
	}
	t.Fatalf("%s not found (%v): apt-get install %s (.ci/run installs it)", tool, err, debianPackage)
	return ""
}

// Missing reports, for a TestMain, why a suite cannot run here: "" when it
// can. Under -short the caller skips the suite; otherwise it fails.
func Missing(needRoot bool, tools map[string]string) string {
	if needRoot && os.Geteuid() != 0 {
		return "must run as root"
	}
	for tool, pkg := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			return tool + " not found (apt-get install " + pkg + ")"
		}
	}
	return ""
}

// FreeUDP returns a loopback UDP address nothing listens on now, for a
// listener process the test starts later. Its port is below the kernel's
// ephemeral range (32768 and up): a port from that range, given back and
// bound again later, can be handed meanwhile to any other process that
// binds port 0, as the tests and etcd running beside this one do.
func FreeUDP(t testing.TB) string {
	t.Helper()
	return freePort(t, "udp", func(addr string) (io.Closer, error) { return net.ListenPacket("udp", addr) })
}

// FreeTCP is FreeUDP for a TCP address (a metrics or admin endpoint).
func FreeTCP(t testing.TB) string {
	t.Helper()
	return freePort(t, "tcp", func(addr string) (io.Closer, error) { return net.Listen("tcp", addr) })
}

func freePort(t testing.TB, network string, bind func(addr string) (io.Closer, error)) string {
	t.Helper()
	for range 1000 {
		port := 20000 + mrand.IntN(12000)
		if !reserve(network, port) {
			continue
		}
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		c, err := bind(addr)
		if err != nil {
			continue
		}
		c.Close()
		return addr
	}
	t.Fatalf("no free %s port in 20000-31999", strings.ToUpper(network))
	return ""
}

// A port handed out is given back before the process that asked for it
// binds it, and until then another call could be handed it too: a second
// member of the same etcd cluster, or a test process running beside this
// one. reserve keeps each port to one caller: this process never hands a
// port out twice, and each port it hands out stays locked (flock on a file
// under portLocks) until it exits, so other test processes skip it.
var (
	reservedMu sync.Mutex
	reserved   = map[string]*os.File{}
)

// portLocks is the directory of the ports' lock files, shared by every
// test process on the machine.
var portLocks = filepath.Join(os.TempDir(), "stratum-test-ports")

// reserve claims network's port for this process, reporting false when
// this process or another holds it already. Where the lock file cannot be
// made (another user's directory, no descriptors left), the claim holds in
// this process only.
func reserve(network string, port int) bool {
	reservedMu.Lock()
	defer reservedMu.Unlock()
	key := fmt.Sprintf("%s-%d", network, port)
	if _, ok := reserved[key]; ok {
		return false
	}
	var lock *os.File
	if err := os.MkdirAll(portLocks, 0o700); err == nil {
		if f, err := os.OpenFile(filepath.Join(portLocks, key), os.O_CREATE|os.O_RDWR, 0o600); err == nil {
			if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
				f.Close()
				return false
			}
			lock = f
		}
	}
	reserved[key] = lock
	return true
}
