// Package etcdtest runs real etcd for tests, so the etcd store backend is
// tested against etcd itself rather than a fake: a single member inside the
// test process (Start), or a cluster of member processes that a test can
// kill, partition and secure with TLS, client certificates and a password
// (StartProcs).
//
// Only _test.go files import it; it links the whole etcd server, which no
// Stratum binary should carry.
package etcdtest

import (
	"net/url"
	"path/filepath"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// readyTimeout is generous because the first start on a loaded 2-core
// machine has taken a second or more.
const readyTimeout = 30 * time.Second

// Option changes how Start configures the server.
type Option func(*embed.Config)

// Durable keeps etcd's fsync on, for benchmarks whose figures must include
// the cost of a durable write. Tests leave it off: fsync only slows them.
func Durable() Option {
	return func(c *embed.Config) { c.UnsafeNoFsync = false }
}

// Start runs etcd on 127.0.0.1 (ports chosen by the kernel) with its data in
// t.TempDir(), and returns its client endpoint and a client connected to it.
// Both are closed by t.Cleanup.
func Start(t testing.TB, opts ...Option) (endpoint string, cli *clientv3.Client) {
	t.Helper()
	e := startEmbedded(t, opts...)
	t.Cleanup(e.Close)
	endpoint = "http://" + e.Clients[0].Addr().String()
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{endpoint},
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		t.Fatalf("etcd client: %v", err)
	}
	// Registered after e.Close, so it runs first: the client goes before
	// the server it talks to.
	t.Cleanup(func() { _ = cli.Close() })
	return endpoint, cli
}

// startEmbedded runs one etcd member in this process on 127.0.0.1 (ports
// chosen by the kernel, data in t.TempDir()) and waits until it is ready.
// The caller closes it.
func startEmbedded(t testing.TB, opts ...Option) *embed.Etcd {
	t.Helper()
	local := url.URL{Scheme: "http", Host: "127.0.0.1:0"}
	cfg := embed.NewConfig()
	cfg.Dir = filepath.Join(t.TempDir(), "etcd")
	cfg.ListenClientUrls = []url.URL{local}
	cfg.AdvertiseClientUrls = []url.URL{local}
	cfg.ListenPeerUrls = []url.URL{local}
	cfg.AdvertisePeerUrls = []url.URL{local}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	cfg.UnsafeNoFsync = true
	for _, o := range opts {
		o(cfg)
	}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatalf("start embedded etcd: %v", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		t.Fatalf("embedded etcd failed: %v", err)
	case <-time.After(readyTimeout):
		e.Close()
		t.Fatalf("embedded etcd not ready after %v", readyTimeout)
	}
	return e
}
