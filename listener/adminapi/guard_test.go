package adminapi_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stratumjoin/stratum/listener/adminapi"
)

// wrongKey has the API key form but names no key.
const wrongKey = "sjk_0000000000000000000000000000000000000000000000000000"

// TestFailedAPIKeysAreLimitedPerSource: 300 wrong API keys from one
// address over the three facades get 10 answers of 401, then 429 with
// Retry-After in each facade's shape; another address is still told 401.
func TestFailedAPIKeysAreLimitedPerSource(t *testing.T) {
	e := newEnv(t)
	routes := []struct{ method, path, body string }{
		{"POST", "/api/compute/joinTokens/list", `{"tenantId":"acme","poolId":"pool-a"}`},
		{"GET", "/v1/join-keys", ""},
		{"GET", "/v1/admin/cluster/join-codes", ""},
	}
	counts := map[int]int{}
	for i := range 300 {
		rt := routes[i%3]
		var body any
		if rt.body != "" {
			body = rt.body
		}
		r := e.do(bearer(wrongKey), rt.method, rt.path, body)
		counts[r.status]++
		if r.status != http.StatusTooManyRequests {
			continue
		}
		if s, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || s < 1 || s > 60 {
			t.Fatalf("429 with Retry-After %q", r.header.Get("Retry-After"))
		}
		switch v := r.json(t); i % 3 {
		case 0:
			if v["error"].(map[string]any)["code"] != adminapi.TokenInternal {
				t.Fatalf("joinTokens 429 body %s", r.body)
			}
		case 1:
			if v["errors"].([]any)[0].(map[string]any)["code"] != adminapi.KeyErrTooMany {
				t.Fatalf("join keys 429 body %s", r.body)
			}
		case 2:
			if v["code"] != adminapi.CodeTooMany || r.header.Get("Content-Type") != "application/problem+json" {
				t.Fatalf("join codes 429 body %s", r.body)
			}
		}
	}
	t.Logf("300 wrong API keys: %v", counts)
	if counts[http.StatusUnauthorized] != 10 || counts[http.StatusTooManyRequests] != 290 {
		t.Fatalf("answers by status: %v, want 10 of 401 and 290 of 429", counts)
	}
	// another address has its own allowance
	other := otherSourceClient(t, e)
	req, _ := http.NewRequest("GET", e.base+"/v1/join-keys", nil)
	req.Header.Set("Authorization", "Bearer "+wrongKey)
	resp, err := other.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("a wrong key from %s: %d, want 401", "127.0.1.2", resp.StatusCode)
	}
}

// otherSourceClient is an HTTPS client whose connections leave from
// 127.0.1.2.
func otherSourceClient(t *testing.T, e *env) *http.Client {
	pool := x509.NewCertPool()
	for _, r := range e.l.Roots() {
		pool.AddCert(r)
	}
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.1.2")}}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13},
		DialContext: func(ctx context.Context, n, a string) (net.Conn, error) { return d.DialContext(ctx, n, a) }}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: time.Minute}
}

// TestBodiesMustBeJSON: a text/plain or form-encoded body is refused 415
// in each facade's shape, even when it holds valid JSON.
func TestBodiesMustBeJSON(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct {
		path, ctype, body string
		code              func(map[string]any) any
	}{
		{"/api/compute/joinTokens/list", "text/plain", `{"tenantId":"acme","poolId":"pool-a"}`, func(v map[string]any) any { return v["error"].(map[string]any)["code"] }},
		{"/v1/join-keys", "application/x-www-form-urlencoded", "name=x", func(v map[string]any) any { return v["errors"].([]any)[0].(map[string]any)["code"] }},
		{"/v1/admin/cluster/join-codes", "text/plain", `{}`, func(v map[string]any) any { return v["code"] }},
	} {
		r := e.do(admin, "POST", tc.path, tc.body, "Content-Type", tc.ctype)
		if r.status != http.StatusUnsupportedMediaType {
			t.Fatalf("POST %s as %s: %d %s, want 415", tc.path, tc.ctype, r.status, r.body)
		}
		code := tc.code(r.json(t))
		if s, _ := code.(string); !strings.Contains(s, "MEDIA_TYPE") && s != adminapi.TokenInvalidInput {
			t.Fatalf("POST %s as %s: code %v", tc.path, tc.ctype, code)
		}
	}
	// application/json with a charset is JSON
	r := e.do(admin, "POST", "/v1/admin/cluster/join-codes", `{}`, "Content-Type", "application/json; charset=utf-8")
	if r.status == http.StatusUnsupportedMediaType {
		t.Fatalf("application/json; charset=utf-8 refused: %s", r.body)
	}
}
