package adminapi_test

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/stratumjoin/stratum/internal/cluster"
)

// TestAPIKeysAdmin: the bootstrap admin creates, lists and revokes API
// keys; a key is shown once, stored as a SHA-256 hash, and refused at once
// after revocation.
func TestAPIKeysAdmin(t *testing.T) {
	e := newEnv(t)
	const path = "/v1/admin/api-keys"
	bad := []struct {
		name  string
		body  map[string]any
		field string
	}{
		{"unknown tenant", map[string]any{"tenant": "nope", "scopes": []string{"join-keys:create"}}, "tenant"},
		{"nothing granted", map[string]any{"tenant": "acme"}, "grants"},
		{"unknown action", map[string]any{"tenant": "acme", "grants": []map[string]string{{"action": "compute:join-tokens:delete", "resource": "*"}}}, "grants[0].action"},
		{"pool action on cluster", map[string]any{"tenant": "acme", "grants": []map[string]string{{"action": "compute:join-tokens:create", "resource": "cluster"}}}, "grants[0].resource"},
		{"bad pool pattern", map[string]any{"tenant": "acme", "grants": []map[string]string{{"action": "compute:join-tokens:create", "resource": "compute-pool/a*"}}}, "grants[0].resource"},
		{"ha action on a pool", map[string]any{"tenant": "acme", "grants": []map[string]string{{"action": "ha:DescribeJoinCodes", "resource": "compute-pool/*"}}}, "grants[0].resource"},
		{"unknown scope", map[string]any{"tenant": "acme", "scopes": []string{"hosts:read"}}, "scopes[0]"},
		{"negative ttl", map[string]any{"tenant": "acme", "scopes": []string{"join-keys:create"}, "ttlSeconds": -1}, "ttlSeconds"},
		{"bad name", map[string]any{"tenant": "acme", "scopes": []string{"join-keys:create"}, "name": "\x00"}, "name"},
		{"unknown field", map[string]any{"tenant": "acme", "scopes": []string{"join-keys:create"}, "hash": "x"}, "hash"},
	}
	for _, c := range bad {
		t.Run(c.name, func(t *testing.T) {
			checkProblem(t, e.do(admin, "POST", path, c.body), want{400, "INVALID_INPUT", c.field})
		})
	}

	r := e.do(admin, "POST", path, map[string]any{"tenant": "acme", "name": "ci", "grants": []map[string]string{{"action": "compute:join-tokens:read", "resource": "compute-pool/pool-a"}}, "scopes": []string{"join-keys:list"}})
	if r.status != 201 {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	var k struct {
		ID, Key, Tenant, State string
		Grants                 []cluster.Grant
	}
	r.decode(t, &k)
	if !strings.HasPrefix(k.Key, "sjk_"+k.ID+"_") || k.Tenant != "acme" || k.State != "active" || len(k.Grants) != 1 {
		t.Fatalf("created %+v", k)
	}
	stored, err := e.l.Cluster().APIKey(context.Background(), k.ID)
	if err != nil {
		t.Fatal(err)
	}
	secret := strings.TrimPrefix(k.Key, "sjk_"+k.ID+"_")
	sum := sha256.Sum256([]byte(secret))
	if stored.Hash != hex.EncodeToString(sum[:]) {
		t.Errorf("stored hash %q is not the SHA-256 of the secret", stored.Hash)
	}
	raw, _ := json.Marshal(stored)
	if strings.Contains(string(raw), secret) {
		t.Fatal("the store holds the key's secret")
	}

	list := e.do(admin, "GET", path, nil)
	if list.status != 200 || strings.Contains(string(list.body), secret) || strings.Contains(string(list.body), stored.Hash) || strings.Contains(string(list.body), `"key"`) {
		t.Fatalf("list: %d %s", list.status, list.body)
	}
	if r := e.do(bearer(k.Key), "GET", keysPath, nil); r.status != 200 {
		t.Fatalf("key does not work: %d %s", r.status, r.body)
	}
	// a key with the right id and a wrong secret is refused
	wrong := "sjk_" + k.ID + "_" + strings.Repeat("0", 52)
	checkKeyError(t, e.do(bearer(wrong), "GET", keysPath, nil), want{401, "ERR_UNAUTHORIZED", ""})

	rv := e.do(admin, "POST", path+"/"+k.ID+"/revoke", nil)
	if rv.status != 200 || rv.json(t)["state"] != "revoked" {
		t.Fatalf("revoke: %d %s", rv.status, rv.body)
	}
	checkKeyError(t, e.do(bearer(k.Key), "GET", keysPath, nil), want{401, "ERR_UNAUTHORIZED", ""})
	checkProblem(t, e.do(admin, "POST", path+"/nope/revoke", nil), want{404, "NOT_FOUND", ""})
	if evs := e.events(cluster.EventAPIKeyCreated); len(evs) != 1 || evs[0].Fields["tenant"] != "acme" {
		t.Errorf("created events %+v", evs)
	}
	if evs := e.events(cluster.EventAPIKeyRevoked); len(evs) != 1 {
		t.Errorf("revoked events %+v", evs)
	}
}

// TestHTTPSOnlyTLS13 refuses a TLS 1.2 client, and takes no request that
// does not carry a key: the bootstrap admin lives on the unix socket only.
func TestHTTPSOnlyTLS13(t *testing.T) {
	e := newEnv(t)
	pool := x509.NewCertPool()
	for _, r := range e.l.Roots() {
		pool.AddCert(r)
	}
	old := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MaxVersion: tls.VersionTLS12}}}
	if resp, err := old.Get(e.base + codesPath); err == nil {
		resp.Body.Close()
		t.Fatal("a TLS 1.2 client was served")
	}
	checkProblem(t, e.do(anonymous, "GET", "/v1/admin/cluster/ca", nil), want{401, "UNAUTHORIZED", ""})
	if r := e.do(admin, "GET", "/v1/admin/registry", nil); r.status != 200 || !strings.Contains(string(r.body), `"pool-k8s"`) {
		t.Fatalf("registry: %d %s", r.status, r.body)
	}
}
