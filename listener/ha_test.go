package listener_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stratumjoin/stratum/agent"
	"github.com/stratumjoin/stratum/internal/store/etcdstore"
	"github.com/stratumjoin/stratum/internal/store/etcdtest"
	"github.com/stratumjoin/stratum/internal/wire"
	"github.com/stratumjoin/stratum/listener"
	"github.com/stratumjoin/stratum/listener/adminapi"
	"github.com/stratumjoin/stratum/listener/listenertest"
)

// TestTwoListenersShareEtcd runs two listeners over one real etcd and one
// key directory: a code minted on one joins through the other, and agents
// racing a three-use code through both get exactly three certificates.
func TestTwoListenersShareEtcd(t *testing.T) {
	ep, _ := etcdtest.Start(t)
	shared := func() listener.Config {
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, DialTimeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cli.Close() })
		return listener.Config{Store: etcdstore.New(cli, "/ha/")}
	}
	a := listenertest.Start(t, listenertest.Options{Config: shared()})
	b := listenertest.Start(t, listenertest.Options{DataDir: a.DataDir, Config: shared()})

	sec, code := mint(t, a, adminapi.MintCodeRequest{AutoApprove: true})
	if _, _, err := join(t, b, sec, wire.Facts{}); err != nil {
		t.Fatalf("a code minted on A does not join through B: %v", err)
	}
	if c, _ := b.Admin.Code(context.Background(), code.ID); c.Uses != 1 {
		t.Fatalf("B sees %d uses", c.Uses)
	}

	three := 3
	sec, code = mint(t, b, adminapi.MintCodeRequest{AutoApprove: true, MaxUses: &three})
	var joined, usedUp atomic.Int32
	var wg sync.WaitGroup
	for i := range 30 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := a
			if i%2 == 1 {
				l = b
			}
			_, err := agent.Join(context.Background(), agent.JoinConfig{StateDir: fmt.Sprintf("%s/%d", t.TempDir(), i), Endpoint: l.Endpoint, Secret: sec})
			var refused *agent.RefusedError
			switch {
			case err == nil:
				joined.Add(1)
			case errors.As(err, &refused) && refused.Code == wire.CodeUsedUp:
				usedUp.Add(1)
			default:
				t.Errorf("join via %s: %v", l.Endpoint, err)
			}
		}()
	}
	wg.Wait()
	c, _ := a.Admin.Code(context.Background(), code.ID)
	if joined.Load() != 3 || usedUp.Load() != 27 || c.Uses != 3 || c.Registrations != 3 || c.FailedAttempts != 0 {
		t.Fatalf("%d joined, %d used up; code %+v", joined.Load(), usedUp.Load(), c)
	}
}
