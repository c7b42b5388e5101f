package adminapi_test

import (
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/stratumjoin/stratum/internal/store/etcdstore"
	"github.com/stratumjoin/stratum/internal/store/etcdtest"
	"github.com/stratumjoin/stratum/listener"
)

// TestStoreOutageAnswers503InEachShape: with the store's etcd out of
// quorum, each facade answers 503 in its own error shape, with
// Retry-After, within a bound far below what waiting on etcd took.
func TestStoreOutageAnswers503InEachShape(t *testing.T) {
	etcd := etcdtest.StartStoppable(t)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcd.Endpoint}, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	e := newEnv(t, func(c *listener.Config) {
		c.Store = etcdstore.New(cli, "/outage/")
		c.StoreTimeout = time.Second
	})
	key := e.apiKey("acme", []string{"compute:join-tokens:read@*"}, allKeyScopes()...)

	etcd.Stop()

	for _, tc := range []struct {
		name       string
		c          caller
		method     string
		path       string
		body       any
		codeOf     func(m map[string]any) any
		wantCode   string
		wantHeader string
	}{
		{"join codes", admin, "GET", "/v1/admin/cluster/join-codes", nil,
			func(m map[string]any) any { return m["code"] }, "UNAVAILABLE", "application/problem+json"},
		{"joinTokens", bearer(key), "POST", "/api/compute/joinTokens/list", map[string]any{"tenantId": "acme", "poolId": "pool-a"},
			func(m map[string]any) any { return m["error"].(map[string]any)["code"] }, "UNAVAILABLE", "application/json"},
		{"join keys", bearer(key), "GET", "/v1/join-keys", nil,
			func(m map[string]any) any { return m["errors"].([]any)[0].(map[string]any)["code"] }, "ERR_SERVICE_UNAVAILABLE", "application/json"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			r := e.do(tc.c, tc.method, tc.path, tc.body)
			took := time.Since(start)
			t.Logf("%s answered %d after %v: %s", tc.path, r.status, took, r.body)
			if r.status != 503 {
				t.Fatalf("status %d, want 503", r.status)
			}
			if got := tc.codeOf(r.json(t)); got != tc.wantCode {
				t.Errorf("code %v, want %s", got, tc.wantCode)
			}
			if ct := r.header.Get("Content-Type"); ct != tc.wantHeader {
				t.Errorf("content type %q, want %q", ct, tc.wantHeader)
			}
			if ra := r.header.Get("Retry-After"); ra != "1" {
				t.Errorf("Retry-After %q, want 1 (the store deadline)", ra)
			}
			if took > 20*time.Second {
				t.Errorf("the answer took %v", took)
			}
		})
	}
}
