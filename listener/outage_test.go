package listener_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/stratumjoin/stratum/agent"
	"github.com/stratumjoin/stratum/internal/store/etcdstore"
	"github.com/stratumjoin/stratum/internal/store/etcdtest"
	"github.com/stratumjoin/stratum/internal/wire"
	"github.com/stratumjoin/stratum/listener"
	"github.com/stratumjoin/stratum/listener/adminapi"
	"github.com/stratumjoin/stratum/listener/adminclient"
	"github.com/stratumjoin/stratum/listener/listenertest"
)

// outageBound bounds how long an answer may take once the store is cut
// off: the store deadline here is 1 s, and before deadlines an agent
// waited 90 s and `codes list` over two minutes. It only bounds a wait
// for an answer that must come.
const outageBound = 20 * time.Second

// TestStoreOutageAnswersUnavailable: with its etcd out of quorum, an agent
// reads a retryable JOIN_UNAVAILABLE that says the listener cannot reach
// its store, with a RetryAfter, and `codes list` answers 503.
func TestStoreOutageAnswersUnavailable(t *testing.T) {
	etcd := etcdtest.StartStoppable(t)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcd.Endpoint}, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	l := listenertest.Start(t, listenertest.Options{Config: listener.Config{Store: etcdstore.New(cli, "/outage/"), StoreTimeout: time.Second}})
	sec, _ := mint(t, l, adminapi.MintCodeRequest{})

	etcd.Stop()

	start := time.Now()
	_, _, err = join(t, l, sec, wire.Facts{})
	took := time.Since(start)
	t.Logf("join refused after %v: %v", took, err)
	var refused *agent.RefusedError
	if !errors.As(err, &refused) || refused.Code != wire.CodeUnavailable || !refused.Retryable() {
		t.Fatalf("join with the store cut off: %v, want a retryable %s", err, wire.CodeUnavailable)
	}
	if !strings.Contains(refused.Message, "cannot reach its store") || refused.RetryAfter < time.Second {
		t.Errorf("refusal %q, retry after %v", refused.Message, refused.RetryAfter)
	}
	if took > outageBound {
		t.Errorf("the refusal took %v", took)
	}

	start = time.Now()
	_, err = l.Admin.Codes(context.Background())
	took = time.Since(start)
	t.Logf("codes list answered after %v: %v", took, err)
	var p *adminclient.ProblemError
	if !errors.As(err, &p) || !p.Transient() || p.Code != adminapi.CodeUnavailable {
		t.Fatalf("codes list with the store cut off: %v, want 503 UNAVAILABLE", err)
	}
	if took > outageBound {
		t.Errorf("the answer took %v", took)
	}
}
