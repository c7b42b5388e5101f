package etcdtest

import (
	"sync"
	"testing"

	"go.etcd.io/etcd/server/v3/embed"
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
	e := startEmbedded(t)
	s := &Stoppable{Endpoint: "http://" + e.Clients[0].Addr().String(), e: e}
	t.Cleanup(s.Stop)
	return s
}
