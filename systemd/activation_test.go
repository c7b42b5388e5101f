package systemd

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// helperEnv makes the test binary act as a socket-activated daemon instead of
// running tests: the only clean way to hand it fds 3 and 4, which in this
// process may belong to the Go runtime or the test harness.
const helperEnv = "STRATUM_SYSTEMD_TEST_HELPER"

func TestMain(m *testing.M) {
	switch mode := os.Getenv(helperEnv); mode {
	case "":
		os.Exit(m.Run())
	case "inspect":
		helperInspect()
	case "serve":
		helperServe()
	default:
		fmt.Fprintf(os.Stderr, "unknown %s=%q\n", helperEnv, mode)
		os.Exit(2)
	}
	os.Exit(0)
}

// helperReport is what a helper process prints on stdout, as JSON.
type helperReport struct {
	Err         string            `json:",omitempty"`
	PacketConns map[string]string `json:",omitempty"` // name -> Go type
	Listeners   map[string]string `json:",omitempty"`
	Datagram    string            `json:",omitempty"`
	Admin       string            `json:",omitempty"`
	SecondEmpty bool
	EnvLeft     []string `json:",omitempty"`
}

func typesOf[T any](m map[string]T) map[string]string {
	out := map[string]string{}
	for k, v := range m {
		out[k] = reflect.TypeOf(v).String()
	}
	return out
}

func printReport(r helperReport) {
	if err := json.NewEncoder(os.Stdout).Encode(r); err != nil {
		os.Exit(3)
	}
}

// helperInspect reports what Activation made of the fds it was given.
func helperInspect() {
	a, err := Activation()
	r := helperReport{PacketConns: typesOf(a.PacketConns), Listeners: typesOf(a.Listeners)}
	if err != nil {
		r.Err = err.Error()
	}
	printReport(r)
}

// helperServe answers one datagram on "quic" and, when there is one, one
// line on "admin", each with "ack:" and what it received, then checks that
// the activation cannot be consumed twice.
func helperServe() {
	var r helperReport
	a, err := Activation()
	r.PacketConns, r.Listeners = typesOf(a.PacketConns), typesOf(a.Listeners)
	if err != nil {
		r.Err = err.Error()
		printReport(r)
		os.Exit(0)
	}
	fail := func(format string, args ...any) {
		r.Err = fmt.Sprintf(format, args...)
		printReport(r)
		os.Exit(0)
	}
	pc, ok := a.PacketConns[QUICSocketName]
	if !ok {
		fail("no %q socket", QUICSocketName)
	}
	buf := make([]byte, 1500)
	_ = pc.SetDeadline(time.Now().Add(20 * time.Second))
	n, from, err := pc.ReadFrom(buf)
	if err != nil {
		fail("read datagram: %v", err)
	}
	r.Datagram = string(buf[:n])
	if _, err := pc.WriteTo(append([]byte("ack:"), buf[:n]...), from); err != nil {
		fail("reply datagram: %v", err)
	}
	if l, ok := a.Listeners[AdminSocketName]; ok {
		_ = l.(*net.UnixListener).SetDeadline(time.Now().Add(20 * time.Second))
		conn, err := l.Accept()
		if err != nil {
			fail("accept admin: %v", err)
		}
		_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
		line, err := bufio.NewReader(conn).ReadString('\n')
		if err != nil {
			fail("read admin: %v", err)
		}
		r.Admin = strings.TrimSuffix(line, "\n")
		if _, err := conn.Write([]byte("ack:" + line)); err != nil {
			fail("reply admin: %v", err)
		}
		conn.Close()
	}
	second, err := Activation()
	r.SecondEmpty = err == nil && second.Empty()
	for _, k := range []string{"LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"} {
		if v, ok := os.LookupEnv(k); ok {
			r.EnvLeft = append(r.EnvLeft, k+"="+v)
		}
	}
	_ = a.Close()
	printReport(r)
	os.Exit(0)
}

// helperCommand runs the test binary as a helper with files at fds 3, 4, ...
// LISTEN_PID must be the helper's own pid, known only after fork: sh sets it
// to $$ and exec keeps that pid.
func helperCommand(t *testing.T, mode string, files []*os.File, fdnames string) *exec.Cmd {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(sh, "-c", `LISTEN_PID=$$; export LISTEN_PID; exec "$0"`, exe)
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "LISTEN_") })
	env = append(env, helperEnv+"="+mode, "LISTEN_FDS="+strconv.Itoa(len(files)))
	if fdnames != "" {
		env = append(env, "LISTEN_FDNAMES="+fdnames)
	}
	cmd.Env = env
	cmd.ExtraFiles = files
	return cmd
}

func parseReport(t *testing.T, out []byte) helperReport {
	t.Helper()
	var r helperReport
	// The last line is the final report.
	lines := bytes.Split(bytes.TrimSpace(out), []byte("\n"))
	if err := json.Unmarshal(lines[len(lines)-1], &r); err != nil {
		t.Fatalf("helper output %q: %v", out, err)
	}
	return r
}

func TestActivationNotActivated(t *testing.T) {
	for _, k := range []string{"LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"} {
		t.Setenv(k, "")
		os.Unsetenv(k)
	}
	a, err := Activation()
	if err != nil {
		t.Fatal(err)
	}
	if !a.Empty() || a.PacketConns == nil || a.Listeners == nil {
		t.Errorf("got %+v, want empty, non-nil maps", a)
	}
}

// Sockets meant for another process (a parent that forgot to unset the
// variables) are left alone, and the variables are consumed anyway.
func TestActivationForAnotherProcess(t *testing.T) {
	t.Setenv("LISTEN_PID", "1")
	t.Setenv("LISTEN_FDS", "2")
	t.Setenv("LISTEN_FDNAMES", "quic:admin")
	a, err := Activation()
	if err != nil {
		t.Fatal(err)
	}
	if !a.Empty() {
		t.Errorf("got %+v, want empty", a)
	}
	if _, ok := os.LookupEnv("LISTEN_FDS"); ok {
		t.Error("LISTEN_FDS still set")
	}
}

func TestActivationServes(t *testing.T) {
	udp, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	adminPath := filepath.Join(t.TempDir(), "admin.sock")
	admin, err := net.ListenUnix("unix", &net.UnixAddr{Name: adminPath, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	// The helper owns the socket from now on; our Close must not unlink it.
	admin.SetUnlinkOnClose(false)
	udpFile, err := udp.File()
	if err != nil {
		t.Fatal(err)
	}
	adminFile, err := admin.File()
	if err != nil {
		t.Fatal(err)
	}

	cmd := helperCommand(t, "serve", []*os.File{udpFile, adminFile}, QUICSocketName+":"+AdminSocketName)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	// Close every copy here, so whatever answers is the helper's fd.
	for _, c := range []interface{ Close() error }{udpFile, adminFile, udp, admin} {
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}

	client, err := net.DialUDP("udp", nil, udp.LocalAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	if _, err := client.Write([]byte("hello-quic")); err != nil {
		t.Fatal(err)
	}
	_ = client.SetReadDeadline(time.Now().Add(20 * time.Second))
	buf := make([]byte, 100)
	n, err := client.Read(buf)
	if err != nil {
		t.Fatalf("no datagram reply: %v\nstderr: %s", err, stderr.String())
	}
	if got := string(buf[:n]); got != "ack:hello-quic" {
		t.Errorf("datagram reply %q", got)
	}

	conn, err := net.DialTimeout("unix", adminPath, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := conn.Write([]byte("hello-admin\n")); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		t.Fatalf("no admin reply: %v", err)
	}
	if line != "ack:hello-admin\n" {
		t.Errorf("admin reply %q", line)
	}

	if err := cmd.Wait(); err != nil {
		t.Fatalf("helper: %v\nstderr: %s", err, stderr.String())
	}
	r := parseReport(t, stdout.Bytes())
	if r.Err != "" {
		t.Fatalf("helper: %s", r.Err)
	}
	wantPC := map[string]string{QUICSocketName: "*net.UDPConn"}
	wantL := map[string]string{AdminSocketName: "*net.UnixListener"}
	if !reflect.DeepEqual(r.PacketConns, wantPC) || !reflect.DeepEqual(r.Listeners, wantL) {
		t.Errorf("helper got packet conns %v and listeners %v, want %v and %v", r.PacketConns, r.Listeners, wantPC, wantL)
	}
	if r.Datagram != "hello-quic" || r.Admin != "hello-admin" {
		t.Errorf("helper received %q and %q", r.Datagram, r.Admin)
	}
	if !r.SecondEmpty {
		t.Error("a second Activation() still returned sockets")
	}
	if len(r.EnvLeft) > 0 {
		t.Errorf("activation left %q in the environment", r.EnvLeft)
	}
}

func TestActivationRefusesWhatItCannotUse(t *testing.T) {
	udpFile := func(t *testing.T) *os.File {
		c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		f, err := c.File()
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	tests := []struct {
		name    string
		files   func(t *testing.T) []*os.File
		fdnames string
		wantErr string
		wantPC  map[string]string
	}{
		{
			name: "regular file",
			files: func(t *testing.T) []*os.File {
				f, err := os.CreateTemp(t.TempDir(), "notasocket")
				if err != nil {
					t.Fatal(err)
				}
				return []*os.File{f}
			},
			fdnames: "quic",
			wantErr: `socket "quic": not a socket`,
		},
		{
			name:    "one name for two sockets",
			files:   func(t *testing.T) []*os.File { return []*os.File{udpFile(t), udpFile(t)} },
			fdnames: "quic:quic",
			wantErr: `2 sockets named "quic"`,
		},
		{
			name: "connected stream socket",
			files: func(t *testing.T) []*os.File {
				fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
				if err != nil {
					t.Fatal(err)
				}
				syscall.Close(fds[1])
				return []*os.File{os.NewFile(uintptr(fds[0]), "pair")}
			},
			fdnames: "admin",
			wantErr: "not listening",
		},
		{
			// Without FileDescriptorName= go-systemd names the fd itself.
			name:   "unnamed",
			files:  func(t *testing.T) []*os.File { return []*os.File{udpFile(t)} },
			wantPC: map[string]string{"LISTEN_FD_3": "*net.UDPConn"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			files := tt.files(t)
			cmd := helperCommand(t, "inspect", files, tt.fdnames)
			out, err := cmd.Output()
			for _, f := range files {
				f.Close()
			}
			if err != nil {
				t.Fatalf("helper: %v", err)
			}
			r := parseReport(t, out)
			if tt.wantErr != "" {
				if !strings.Contains(r.Err, tt.wantErr) {
					t.Errorf("error %q, want it to contain %q", r.Err, tt.wantErr)
				}
				if len(r.PacketConns) != 0 || len(r.Listeners) != 0 {
					t.Errorf("got sockets %v %v along with the error", r.PacketConns, r.Listeners)
				}
				return
			}
			if r.Err != "" {
				t.Fatalf("unexpected error %q", r.Err)
			}
			if !reflect.DeepEqual(r.PacketConns, tt.wantPC) {
				t.Errorf("packet conns %v, want %v", r.PacketConns, tt.wantPC)
			}
		})
	}
}

// TestSystemdSocketActivate runs the helper under systemd's own activator,
// which binds the UDP socket, waits for the first datagram and only then
// execs the daemon with LISTEN_* set: the datagram path as systemd does it.
func TestSystemdSocketActivate(t *testing.T) {
	activate := requireTool(t, "systemd-socket-activate")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// systemd-socket-activate refuses port 0, so borrow a free port; retry if
	// someone takes it in between.
	var (
		cmd       *exec.Cmd
		stdout    bytes.Buffer
		stderrLog bytes.Buffer
		drained   = make(chan struct{})
		port      int
	)
	for attempt := 0; ; attempt++ {
		probe, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
		port = probe.LocalAddr().(*net.UDPAddr).Port
		probe.Close()
		cmd = exec.Command(activate, "--datagram", "-l", "127.0.0.1:"+strconv.Itoa(port),
			"--fdname="+QUICSocketName, "-E", helperEnv+"=serve", exe)
		stdout.Reset()
		cmd.Stdout = &stdout
		stderr, err := cmd.StderrPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// "Listening on 127.0.0.1:PORT as 3." means the socket is bound.
		rd := bufio.NewReader(stderr)
		line, err := rd.ReadString('\n')
		if err == nil && strings.HasPrefix(line, "Listening on") {
			go func() {
				defer close(drained)
				_, _ = io.Copy(&stderrLog, rd)
			}()
			break
		}
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if attempt == 2 {
			t.Fatalf("systemd-socket-activate did not start: %q %v", line, err)
		}
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-drained
		_ = cmd.Wait()
	})

	client, err := net.DialUDP("udp", nil, &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	if _, err := client.Write([]byte("first-datagram")); err != nil {
		t.Fatal(err)
	}
	_ = client.SetReadDeadline(time.Now().Add(20 * time.Second))
	buf := make([]byte, 100)
	n, err := client.Read(buf)
	if err != nil {
		t.Fatalf("no reply from the activated helper: %v", err)
	}
	// The datagram that woke the activator stays queued for the daemon.
	if got := string(buf[:n]); got != "ack:first-datagram" {
		t.Errorf("reply %q", got)
	}
	<-drained // the helper has exited and closed its stderr
	if err := cmd.Wait(); err != nil {
		t.Fatalf("helper: %v\n%s", err, stderrLog.String())
	}
	t.Logf("systemd-socket-activate said: %s", strings.TrimSpace(stderrLog.String()))
	r := parseReport(t, stdout.Bytes())
	if r.Err != "" {
		t.Fatalf("helper: %s", r.Err)
	}
	if got := r.PacketConns[QUICSocketName]; got != "*net.UDPConn" {
		t.Errorf("%q socket is %s, want *net.UDPConn", QUICSocketName, got)
	}
	if !r.SecondEmpty || len(r.EnvLeft) > 0 {
		t.Errorf("activation not consumed: second empty %v, env left %q", r.SecondEmpty, r.EnvLeft)
	}
}
