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
	"strings"
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
		addr := fmt.Sprintf("127.0.0.1:%d", 20000+mrand.IntN(12000))
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
