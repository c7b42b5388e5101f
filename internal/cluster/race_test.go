package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stratumjoin/stratum/internal/cluster"
	"github.com/stratumjoin/stratum/internal/joincode"
	"github.com/stratumjoin/stratum/internal/store"
	"github.com/stratumjoin/stratum/internal/store/boltstore"
	"github.com/stratumjoin/stratum/internal/store/etcdstore"
	"github.com/stratumjoin/stratum/internal/store/etcdtest"
	"github.com/stratumjoin/stratum/internal/wire"
)

// backends gives each test two Clusters over one shared store: one bbolt
// file (both in this process, as one listener's goroutines are), and one
// etcd reached through two clients, as two listeners would.
func backends(t *testing.T) map[string]func(t *testing.T) [2]*cluster.Cluster {
	return map[string]func(t *testing.T) [2]*cluster.Cluster{
		"bolt": func(t *testing.T) [2]*cluster.Cluster {
			s, err := boltstore.Open(filepath.Join(t.TempDir(), "state.db"), boltstore.Options{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			c := cluster.New(cluster.Config{Store: s})
			return [2]*cluster.Cluster{c, c}
		},
		"etcd": func(t *testing.T) [2]*cluster.Cluster {
			ep, _ := etcdtest.Start(t)
			var cs [2]*cluster.Cluster
			prefix := fmt.Sprintf("/race-%d/", time.Now().UnixNano())
			for i := range cs {
				cli, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, DialTimeout: 5 * time.Second})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { cli.Close() })
				cs[i] = cluster.New(cluster.Config{Store: store.Store(etcdstore.New(cli, prefix))})
			}
			return cs
		},
	}
}

func mintCode(t *testing.T, c *cluster.Cluster, maxUses int) *cluster.Secret {
	t.Helper()
	exp := time.Now().Add(time.Hour)
	s, _, err := c.Mint(context.Background(), cluster.SecretSpec{
		Secret:    cluster.Secret{ID: "jc-race", Kind: cluster.KindCode, Pool: "p", Role: cluster.RoleNode, Trust: cluster.TrustPlatform, MaxUses: maxUses, ExpiresAt: &exp, CAFingerprint: "fp"},
		EventType: cluster.EventCodeCreated,
		Mint: func(locator string) (joincode.Secret, []byte, error) {
			sec, err := joincode.NewCode(locator)
			return sec, []byte("record"), err
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestAttemptCountingRace: 100 concurrent starts on one live code, spread
// over two listeners, count exactly 10 and burn it, whatever the backend.
func TestAttemptCountingRace(t *testing.T) {
	for name, open := range backends(t) {
		t.Run(name, func(t *testing.T) {
			cs := open(t)
			s := mintCode(t, cs[0], 1)
			var counted, busy atomic.Int32
			var wg sync.WaitGroup
			for i := range 100 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					c := cs[i%2]
					for {
						att, err := c.BeginAttempt(context.Background(), s.Locator)
						if errors.Is(err, cluster.ErrBusy) {
							busy.Add(1)
							time.Sleep(time.Millisecond) // back off and try again, as a listener does while ErrBusy
							continue
						}
						if err != nil {
							t.Error(err)
							return
						}
						if att.Counted {
							counted.Add(1)
							// a wrong code: the attempt ends unproven
							if err := c.Abandon(context.Background(), att); err != nil {
								t.Error(err)
							}
						}
						return
					}
				}()
			}
			wg.Wait()
			got, err := cs[0].Secret(context.Background(), s.ID)
			if err != nil {
				t.Fatal(err)
			}
			if counted.Load() != cluster.MaxUnproven || got.Unproven != cluster.MaxUnproven || !got.Burned() {
				t.Fatalf("counted %d, stored unproven %d, burned %v", counted.Load(), got.Unproven, got.Burned())
			}
			t.Logf("%s: 100 starts, %d counted, %d waits on in-flight attempts", name, counted.Load(), busy.Load())
		})
	}
}

// TestUsesRace: 40 holders of the right code prove at once through two
// listeners; exactly maxUses join.
func TestUsesRace(t *testing.T) {
	for name, open := range backends(t) {
		t.Run(name, func(t *testing.T) {
			cs := open(t)
			s := mintCode(t, cs[0], 3)
			var joined, usedUp atomic.Int32
			var n atomic.Int32
			var wg sync.WaitGroup
			for i := range 40 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					c := cs[i%2]
					att, err := beginWhileBusy(c, s.Locator)
					if err != nil {
						t.Error(err)
						return
					}
					out, err := c.Prove(context.Background(), cluster.ProveRequest{
						Attempt: att, KeyFP: fmt.Sprint("key", i), CurrentCA: "fp",
						NewNodeID: func() (string, error) { return fmt.Sprint("node-", n.Add(1)), nil },
						Issue: func(id, role string) (cluster.Cert, error) {
							return cluster.Cert{Serial: fmt.Sprint("serial-", id, "-", n.Add(1)), NotAfter: time.Now().Add(time.Hour)}, nil
						},
					})
					switch {
					case err != nil:
						t.Error(err)
					case out.Status == wire.StatusJoined:
						joined.Add(1)
					case out.Code == wire.CodeUsedUp:
						usedUp.Add(1)
					default:
						t.Errorf("outcome %+v", out)
					}
				}()
			}
			wg.Wait()
			got, _ := cs[0].Secret(context.Background(), s.ID)
			nodes, _ := cs[1].Nodes(context.Background())
			if joined.Load() != 3 || usedUp.Load() != 37 || got.Uses != 3 || got.Registrations != 3 || len(nodes) != 3 || got.Unproven != 0 {
				t.Fatalf("joined %d, used up %d, secret uses %d registrations %d unproven %d, %d nodes", joined.Load(), usedUp.Load(), got.Uses, got.Registrations, got.Unproven, len(nodes))
			}
		})
	}
}

// TestWaveSignsOncePerJoin: 32 holders of one unlimited code join at once
// through two listeners; all join, and each join signs one certificate,
// whatever rounds its transaction lost to the others.
func TestWaveSignsOncePerJoin(t *testing.T) {
	for name, open := range backends(t) {
		t.Run(name, func(t *testing.T) {
			cs := open(t)
			s := mintCode(t, cs[0], 0)
			const n = 32
			var signed, ids, joined atomic.Int32
			var wg sync.WaitGroup
			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					c := cs[i%2]
					att, err := beginWhileBusy(c, s.Locator)
					if err != nil {
						t.Error(err)
						return
					}
					out, err := c.Prove(context.Background(), cluster.ProveRequest{
						Attempt: att, KeyFP: fmt.Sprint("key", i), CurrentCA: "fp",
						NewNodeID: func() (string, error) { return fmt.Sprint("node-", ids.Add(1)), nil },
						Issue: func(id, role string) (cluster.Cert, error) {
							return cluster.Cert{Serial: fmt.Sprint("serial-", id, "-", signed.Add(1)), NotAfter: time.Now().Add(time.Hour)}, nil
						},
					})
					if err != nil {
						t.Error(err)
						return
					}
					if out.Status != wire.StatusJoined {
						t.Errorf("outcome %+v", out)
						return
					}
					joined.Add(1)
				}()
			}
			wg.Wait()
			nodes, _ := cs[0].Nodes(context.Background())
			if joined.Load() != n || len(nodes) != n || signed.Load() != n || ids.Load() != n {
				t.Fatalf("joined %d, %d nodes, %d certificates signed, %d node ids made; want %d each", joined.Load(), len(nodes), signed.Load(), ids.Load(), n)
			}
		})
	}
}

// beginWhileBusy begins an attempt, backing off and trying again while
// the secret's attempts are all in flight (ErrBusy), as a listener does.
func beginWhileBusy(c *cluster.Cluster, locator string) (cluster.Attempt, error) {
	for {
		att, err := c.BeginAttempt(context.Background(), locator)
		if !errors.Is(err, cluster.ErrBusy) {
			return att, err
		}
		time.Sleep(time.Millisecond)
	}
}
