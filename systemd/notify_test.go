package systemd

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// listenNotify stands in for systemd's notify socket.
func listenNotify(t *testing.T) (string, *net.UnixConn) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify.sock")
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return path, c
}

func recvNotify(t *testing.T, c *net.UnixConn) string {
	t.Helper()
	buf := make([]byte, 4096)
	if err := c.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	n, err := c.Read(buf)
	if err != nil {
		t.Fatalf("no notification arrived: %v", err)
	}
	return string(buf[:n])
}

// expectSilence fails if anything arrives within wait.
func expectSilence(t *testing.T, c *net.UnixConn, wait time.Duration) {
	t.Helper()
	buf := make([]byte, 4096)
	if err := c.SetReadDeadline(time.Now().Add(wait)); err != nil {
		t.Fatal(err)
	}
	n, err := c.Read(buf)
	if err == nil {
		t.Fatalf("unexpected notification %q", buf[:n])
	}
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read notify socket: %v", err)
	}
}

func TestNotifierMessages(t *testing.T) {
	path, c := listenNotify(t)
	t.Setenv("NOTIFY_SOCKET", path)
	n := NewNotifier(nil)
	if !n.Enabled() {
		t.Fatal("Enabled() = false with NOTIFY_SOCKET set")
	}
	tests := []struct {
		name string
		send func() error
		want string
	}{
		{"ready", func() error { return n.Ready("") }, "READY=1"},
		{"ready with status", func() error { return n.Ready("joined as node-0001") }, "READY=1\nSTATUS=joined as node-0001"},
		{"status", func() error { return n.Status("renewing certificate") }, "STATUS=renewing certificate"},
		{"status cannot add fields", func() error { return n.Status("refused\nREADY=1\r\x00") }, "STATUS=refused READY=1  "},
		{"stopping", n.Stopping, "STOPPING=1"},
		{"watchdog", n.Watchdog, "WATCHDOG=1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.send(); err != nil {
				t.Fatal(err)
			}
			if got := recvNotify(t, c); got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestNotifierWithoutSocketIsSilent(t *testing.T) {
	_, c := listenNotify(t)
	t.Setenv("NOTIFY_SOCKET", "")
	os.Unsetenv("NOTIFY_SOCKET")
	n := NewNotifier(nil)
	if n.Enabled() {
		t.Fatal("Enabled() = true without NOTIFY_SOCKET")
	}
	for name, send := range map[string]func() error{
		"ready":    func() error { return n.Ready("up") },
		"status":   func() error { return n.Status("x") },
		"stopping": n.Stopping,
		"watchdog": n.Watchdog,
	} {
		if err := send(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	expectSilence(t, c, 200*time.Millisecond)
}

// The socket is read once: unsetting NOTIFY_SOCKET later (so children do not
// inherit it) does not silence the Notifier.
func TestNotifierReadsSocketOnce(t *testing.T) {
	path, c := listenNotify(t)
	t.Setenv("NOTIFY_SOCKET", path)
	n := NewNotifier(nil)
	os.Unsetenv("NOTIFY_SOCKET")
	if err := n.Ready(""); err != nil {
		t.Fatal(err)
	}
	if got := recvNotify(t, c); got != "READY=1" {
		t.Errorf("got %q", got)
	}
}

func TestNotifierAbstractSocket(t *testing.T) {
	name := "@stratum-systemd-test-" + strconv.Itoa(os.Getpid())
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: name, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	t.Setenv("NOTIFY_SOCKET", name)
	if err := NewNotifier(nil).Status("abstract"); err != nil {
		t.Fatal(err)
	}
	if got := recvNotify(t, c); got != "STATUS=abstract" {
		t.Errorf("got %q", got)
	}
}

func TestNotifierErrorKeepsStatusOut(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", filepath.Join(t.TempDir(), "missing.sock"))
	err := NewNotifier(nil).Ready("joined with code ABCD-EFGH")
	if !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("Ready to a missing socket: %v, want ENOENT", err)
	}
	if msg := err.Error(); strings.Contains(msg, "ABCD") || !strings.Contains(msg, "READY") {
		t.Errorf("error %q should name READY and not carry the status text", msg)
	}
}

func TestWatchdogInterval(t *testing.T) {
	self := strconv.Itoa(os.Getpid())
	tests := []struct {
		name      string
		usec, pid string // "-" leaves the variable unset
		want      time.Duration
		wantErr   bool
	}{
		{"unset", "-", "-", 0, false},
		{"ours", "200000", self, 100 * time.Millisecond, false},
		{"no pid", "3000000", "-", 1500 * time.Millisecond, false},
		{"other process", "200000", "1", 0, false},
		{"garbage", "soon", self, 0, true},
		{"negative", "-5", self, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			setOrUnset(t, "WATCHDOG_USEC", tt.usec)
			setOrUnset(t, "WATCHDOG_PID", tt.pid)
			got, err := WatchdogInterval()
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if got != tt.want {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}

func setOrUnset(t *testing.T, key, value string) {
	t.Helper()
	t.Setenv(key, value) // restores the old value after the test
	if value == "-" {
		os.Unsetenv(key)
	}
}

// fakeTicker ticks when the test says so.
type fakeTicker struct {
	c       chan time.Time
	mu      sync.Mutex
	stopped bool
}

func (f *fakeTicker) Chan() <-chan time.Time { return f.c }
func (f *fakeTicker) Stop() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stopped = true
}
func (f *fakeTicker) isStopped() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.stopped
}

func startWatchdog(t *testing.T, n *Notifier, interval time.Duration) (cancel func(), done <-chan struct{}) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	d := make(chan struct{})
	go func() {
		defer close(d)
		n.RunWatchdog(ctx, interval)
	}()
	t.Cleanup(func() {
		cancel()
		<-d
	})
	return cancel, d
}

func waitDone(t *testing.T, done <-chan struct{}) {
	t.Helper()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("RunWatchdog did not return")
	}
}

func TestRunWatchdogPingsOnEachTick(t *testing.T) {
	path, c := listenNotify(t)
	t.Setenv("NOTIFY_SOCKET", path)
	n := NewNotifier(nil)
	ft := &fakeTicker{c: make(chan time.Time)}
	var gotInterval time.Duration
	n.newTicker = func(d time.Duration) ticker { gotInterval = d; return ft }

	cancel, done := startWatchdog(t, n, 30*time.Second)
	// One ping at once, so a freshly started daemon is covered before the
	// first tick.
	if got := recvNotify(t, c); got != "WATCHDOG=1" {
		t.Fatalf("first ping %q", got)
	}
	if gotInterval != 30*time.Second {
		t.Errorf("ticker interval %v, want 30s", gotInterval)
	}
	for i := range 3 {
		ft.c <- time.Now()
		if got := recvNotify(t, c); got != "WATCHDOG=1" {
			t.Fatalf("ping after tick %d: %q", i, got)
		}
	}
	cancel()
	waitDone(t, done)
	if !ft.isStopped() {
		t.Error("ticker not stopped")
	}
	expectSilence(t, c, 100*time.Millisecond)
}

func TestRunWatchdogReturnsWhenNothingToDo(t *testing.T) {
	path, c := listenNotify(t)
	tests := []struct {
		name     string
		socket   string
		interval time.Duration
	}{
		{"no socket", "", time.Millisecond},
		{"watchdog off", path, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("NOTIFY_SOCKET", tt.socket)
			n := NewNotifier(nil)
			n.newTicker = func(time.Duration) ticker {
				t.Error("ticker started")
				return &fakeTicker{c: make(chan time.Time)}
			}
			// ctx never ends: RunWatchdog must return on its own.
			_, done := startWatchdog(t, n, tt.interval)
			waitDone(t, done)
			expectSilence(t, c, 50*time.Millisecond)
		})
	}
}

// TestRunWatchdogRealTimer runs the real ticker at the interval systemd
// would ask for with WatchdogSec=200ms.
func TestRunWatchdogRealTimer(t *testing.T) {
	path, c := listenNotify(t)
	t.Setenv("NOTIFY_SOCKET", path)
	t.Setenv("WATCHDOG_USEC", "200000")
	t.Setenv("WATCHDOG_PID", strconv.Itoa(os.Getpid()))
	interval, err := WatchdogInterval()
	if err != nil {
		t.Fatal(err)
	}
	if interval != 100*time.Millisecond {
		t.Fatalf("interval %v, want 100ms", interval)
	}
	cancel, done := startWatchdog(t, NewNotifier(nil), interval)

	// About 11 pings are due in 1s; ask for 4 so a slow, shared CI machine
	// cannot make this flaky.
	const window, atLeast = time.Second, 4
	deadline := time.Now().Add(window)
	pings := 0
	buf := make([]byte, 64)
	for {
		if err := c.SetReadDeadline(deadline); err != nil {
			t.Fatal(err)
		}
		n, err := c.Read(buf)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if string(buf[:n]) != "WATCHDOG=1" {
			t.Fatalf("unexpected message %q", buf[:n])
		}
		pings++
	}
	t.Logf("%d pings in %v at a %v interval", pings, window, interval)
	if pings < atLeast {
		t.Errorf("%d pings in %v, want at least %d", pings, window, atLeast)
	}
	cancel()
	waitDone(t, done)
	// Drain what was sent before cancel took effect, then nothing more.
	for {
		if err := c.SetReadDeadline(time.Now().Add(300 * time.Millisecond)); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Read(buf); err != nil {
			break
		}
	}
	expectSilence(t, c, 300*time.Millisecond)
}

// recordHandler is a slog.Handler that keeps the records it is given.
type recordHandler struct {
	mu      sync.Mutex
	records []slog.Record
}

func (h *recordHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *recordHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.records = append(h.records, r.Clone())
	return nil
}
func (h *recordHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *recordHandler) WithGroup(string) slog.Handler      { return h }

func (h *recordHandler) messages() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, r := range h.records {
		out = append(out, r.Level.String()+" "+r.Message)
	}
	return out
}

// A notify socket that goes away is logged once, not on every tick, and its
// return is logged too.
func TestRunWatchdogLogsFailureOnce(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "notify.sock")
	t.Setenv("NOTIFY_SOCKET", path)
	h := &recordHandler{}
	n := NewNotifier(slog.New(h))
	ft := &fakeTicker{c: make(chan time.Time)}
	n.newTicker = func(time.Duration) ticker { return ft }

	cancel, done := startWatchdog(t, n, time.Second) // first ping fails: no socket yet
	for range 3 {
		ft.c <- time.Now() // fails again
	}
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ft.c <- time.Now()
	if got := recvNotify(t, c); got != "WATCHDOG=1" {
		t.Fatalf("got %q", got)
	}
	cancel()
	waitDone(t, done)
	got := h.messages()
	want := []string{"WARN systemd watchdog ping failed", "INFO systemd watchdog ping works again"}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("log = %q, want %q", got, want)
	}
}
