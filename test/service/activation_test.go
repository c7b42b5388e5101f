package service

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stratumjoin/stratum/internal/testenv"
	"github.com/stratumjoin/stratum/listener/adminapi"
	"github.com/stratumjoin/stratum/listener/adminclient"
)

// freeUDP returns a loopback UDP address for a listener to bind.
func freeUDP(t *testing.T) string { return testenv.FreeUDP(t) }

func initListener(t *testing.T, endpoint string) string {
	t.Helper()
	data := filepath.Join(t.TempDir(), "listener")
	if out, err := exec.Command(bin("stratum-listener"), "init", "--data", data, "--light-ksf", "--endpoint", endpoint).CombinedOutput(); err != nil {
		t.Fatalf("init: %v\n%s", err, out)
	}
	return data
}

// mintWhenUp mints a code over the admin socket, waiting for it to answer.
func mintWhenUp(t *testing.T, sock string) adminapi.Code {
	t.Helper()
	c := adminclient.New(sock)
	deadline := time.Now().Add(15 * time.Second)
	for {
		code, err := c.MintCode(context.Background(), adminapi.MintCodeRequest{AutoApprove: true})
		if err == nil {
			return code
		}
		if time.Now().After(deadline) {
			t.Fatalf("admin socket %s: %v", sock, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// agentJoin runs `stratum-agent join` and returns the node id it prints.
func agentJoin(t *testing.T, endpoint, code string) string {
	t.Helper()
	codeFile := writeCode(t, filepath.Join(t.TempDir(), "code"), code)
	hw := filepath.Join(repoRoot(t), "testdata", "sysfs", "dell-r760")
	cmd := exec.Command(bin("stratum-agent"), "join", "--json", "--endpoint", endpoint, "--code-file", codeFile, "--state", filepath.Join(t.TempDir(), "state"), "--root", hw)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("join %s: %v\n%s", endpoint, err, out)
	}
	var id struct {
		NodeID string `json:"nodeId"`
	}
	if err := json.Unmarshal(out, &id); err != nil || id.NodeID == "" {
		t.Fatalf("join output %s (%v)", out, err)
	}
	return id.NodeID
}

// TestListenerSocketActivation: `stratum-listener serve` takes its UDP
// socket (and its admin socket) from systemd, says READY=1 once the store
// is open, serves a join through the activated socket, and says
// STOPPING=1 on SIGTERM.
func TestListenerSocketActivation(t *testing.T) {
	t.Run("systemd-socket-activate", func(t *testing.T) {
		tool := testenv.NeedTool(t, "systemd-socket-activate", "systemd")
		endpoint := freeUDP(t)
		data := initListener(t, endpoint)
		// The tool starts the listener on the first datagram, and the
		// admin socket exists only then: mint beforehand with the
		// listener run once on another port.
		sock := filepath.Join(shortDir(t), "admin.sock")
		first := start(t, exec.Command(bin("stratum-listener"), "serve", "--data", data, "--listen", "127.0.0.1:0", "--admin-socket", sock))
		code := mintWhenUp(t, sock)
		first.cmd.Process.Signal(syscall.SIGTERM)
		if c := first.exit(t, 10*time.Second); c != 0 {
			t.Fatalf("first serve exit status %d:\n%s", c, first.output())
		}

		n := newNotifySocket(t, nil)
		sock2 := filepath.Join(shortDir(t), "admin.sock")
		p := start(t, exec.Command(tool, "--datagram", "--listen", endpoint, "--fdname=quic", "--setenv=NOTIFY_SOCKET="+n.path,
			bin("stratum-listener"), "serve", "--data", data, "--admin-socket", sock2, "--listen", "127.0.0.1:1"))
		time.Sleep(200 * time.Millisecond) // the tool binds before it waits
		nodeID := agentJoin(t, endpoint, code.Code)
		_, ready := n.wait(t, 0, 10*time.Second, "READY=1", field("READY=1"))
		if want := "serving joins on " + endpoint; ready.status() != want {
			t.Fatalf("READY status %q, want %q (the activated socket, not --listen)", ready.status(), want)
		}
		if _, err := adminclient.New(sock2).Node(context.Background(), nodeID); err != nil {
			t.Fatalf("the activated listener does not know node %s: %v", nodeID, err)
		}
		p.cmd.Process.Signal(syscall.SIGTERM)
		n.wait(t, 0, 10*time.Second, "STOPPING=1", field("STOPPING=1"))
		if c := p.exit(t, 10*time.Second); c != 0 {
			t.Fatalf("exit status %d:\n%s", c, p.output())
		}
	})

	t.Run("LISTEN_FDS", func(t *testing.T) {
		// What systemd does with stratum-listener.socket and
		// stratum-listener-admin.socket: fd 3 is the UDP socket named
		// "quic", fd 4 the listening admin socket named "admin".
		udp, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
		endpoint := udp.LocalAddr().String()
		sock := filepath.Join(shortDir(t), "admin.sock")
		admin, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		udpFile, err := udp.File()
		if err != nil {
			t.Fatal(err)
		}
		adminFile, err := admin.File()
		if err != nil {
			t.Fatal(err)
		}
		udp.Close()
		admin.SetUnlinkOnClose(false) // the socket file stays for the listener
		admin.Close()
		data := initListener(t, endpoint)

		n := newNotifySocket(t, nil)
		unused := filepath.Join(shortDir(t), "unused.sock")
		cmd := exec.Command("sh", "-c", `LISTEN_PID=$$ exec "$0" "$@"`, bin("stratum-listener"), "serve", "--data", data, "--listen", "127.0.0.1:1", "--admin-socket", unused)
		cmd.ExtraFiles = []*os.File{udpFile, adminFile}
		cmd.Env = append(os.Environ(), "LISTEN_FDS=2", "LISTEN_FDNAMES=quic:admin", "NOTIFY_SOCKET="+n.path)
		p := start(t, cmd)
		udpFile.Close()
		adminFile.Close()

		_, ready := n.wait(t, 0, 10*time.Second, "READY=1", field("READY=1"))
		if want := "serving joins on " + endpoint; ready.status() != want {
			t.Fatalf("READY status %q, want %q", ready.status(), want)
		}
		code := mintWhenUp(t, sock)
		nodeID := agentJoin(t, endpoint, code.Code)
		if _, err := adminclient.New(sock).Node(context.Background(), nodeID); err != nil {
			t.Fatalf("node %s: %v", nodeID, err)
		}
		if fileExists(unused) {
			t.Fatal("the listener made its own admin socket beside the activated one")
		}
		p.cmd.Process.Signal(syscall.SIGTERM)
		n.wait(t, 0, 10*time.Second, "STOPPING=1", field("STOPPING=1"))
		if c := p.exit(t, 10*time.Second); c != 0 {
			t.Fatalf("exit status %d:\n%s", c, p.output())
		}
	})
}
