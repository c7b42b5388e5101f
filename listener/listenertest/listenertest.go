// Package listenertest starts real listeners for tests: a fresh data
// directory, a bbolt (or given) store, QUIC on a loopback UDP port and the
// admin API on a unix socket.
package listenertest

import (
	"context"
	"log/slog"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/stratumjoin/stratum/internal/joincode"
	"github.com/stratumjoin/stratum/internal/pake"
	_ "github.com/stratumjoin/stratum/internal/store/boltstore" // bolt: store
	"github.com/stratumjoin/stratum/listener"
	"github.com/stratumjoin/stratum/listener/adminapi"
	"github.com/stratumjoin/stratum/listener/adminclient"
)

// Options adjust a test listener.
type Options struct {
	Init   listener.InitConfig // DataDir and Endpoints are filled in
	Config listener.Config     // DataDir, Listen and AdminSocket are filled in
	// DataDir reuses an initialized directory (a restart).
	DataDir string
}

// Listener is a running test listener.
type Listener struct {
	*listener.Listener
	DataDir     string
	AdminSocket string
	Endpoint    string
	Admin       *adminclient.Client
	cancel      context.CancelFunc
	done        chan error
}

// Start inits (unless opts.DataDir is set) and serves a listener until the
// test ends.
func Start(t testing.TB, opts Options) *Listener {
	t.Helper()
	dir := opts.DataDir
	if dir == "" {
		dir = filepath.Join(t.TempDir(), "listener")
		ic := opts.Init
		ic.DataDir = dir
		if ic.KSF == (pake.KSFParams{}) {
			ic.KSF = pake.LightestKSF
		}
		// the endpoint is rewritten below once the port is known; init
		// only needs it for the certificate's IP SAN
		if len(ic.Endpoints) == 0 {
			ic.Endpoints = []string{"127.0.0.1:9444"}
		}
		if _, err := listener.Init(context.Background(), ic); err != nil {
			t.Fatalf("init listener: %v", err)
		}
	}
	cfg := opts.Config
	cfg.DataDir = dir
	if cfg.PacketConn == nil {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		cfg.PacketConn = pc
	}
	if cfg.AdminSocket == "" && cfg.AdminListener == nil {
		cfg.AdminSocket = filepath.Join(shortTempDir(t), "admin.sock")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	ready := make(chan net.Addr, 1)
	cfg.Ready = func(a net.Addr) { ready <- a }
	ctx, cancel := context.WithCancel(context.Background())
	l, err := listener.New(ctx, cfg)
	if err != nil {
		cancel()
		t.Fatalf("new listener: %v", err)
	}
	tl := &Listener{Listener: l, DataDir: dir, AdminSocket: cfg.AdminSocket, Admin: adminclient.New(cfg.AdminSocket), cancel: cancel, done: make(chan error, 1)}
	go func() { tl.done <- l.Run(ctx) }()
	select {
	case a := <-ready:
		tl.Endpoint = a.String()
	case err := <-tl.done:
		cancel()
		t.Fatalf("listener stopped: %v", err)
	case <-time.After(10 * time.Second):
		cancel()
		t.Fatal("listener not ready after 10s")
	}
	l.SetEndpoint(tl.Endpoint)
	t.Cleanup(tl.Stop)
	return tl
}

// Stop stops the listener and waits for it.
func (l *Listener) Stop() {
	if l.cancel == nil {
		return
	}
	l.cancel()
	l.cancel = nil
	select {
	case <-l.done:
	case <-time.After(10 * time.Second):
	}
}

// shortTempDir keeps unix socket paths under the 108-byte limit.
func shortTempDir(t testing.TB) string {
	dir, err := mkdirTemp()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeAll(dir) })
	return dir
}

// MintCode mints a join code through the admin socket, as the CLI does,
// and returns it parsed with its record.
func (l *Listener) MintCode(t testing.TB, req adminapi.MintCodeRequest) (joincode.Secret, adminapi.Code) {
	t.Helper()
	c, err := l.Admin.MintCode(context.Background(), req)
	if err != nil {
		t.Fatalf("mint: %v", err)
	}
	sec, err := joincode.Parse(c.Code)
	if err != nil {
		t.Fatalf("minted code does not parse: %v", err)
	}
	return sec, c
}
