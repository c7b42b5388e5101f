package etcdtest

import (
	"net/url"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Stoppable is a single-member etcd that a test stops to cut its store
// off: with its only member gone the cluster has no quorum, and every call
// waits as long as its context allows, as it does in a partition.
type Stoppable struct {
	Endpoint string
	once     sync.Once
	e        *embed.Etcd
}

// Stop stops the member; calls after the first do nothing.
func (s *Stoppable) Stop() { s.once.Do(s.e.Close) }

// StartStoppable runs etcd as Start does and returns it for stopping.
func StartStoppable(t testing.TB) *Stoppable {
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
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatalf("start embedded etcd: %v", err)
	}
	s := &Stoppable{Endpoint: "http://" + e.Clients[0].Addr().String(), e: e}
	t.Cleanup(s.Stop)
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		t.Fatalf("embedded etcd failed: %v", err)
	case <-time.After(readyTimeout):
		t.Fatalf("embedded etcd not ready after %v", readyTimeout)
	}
	return s
}
