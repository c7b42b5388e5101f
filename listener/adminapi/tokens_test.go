package adminapi_test

import (
	"context"
	"errors"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stratumjoin/stratum/agent"
	"github.com/stratumjoin/stratum/internal/cluster"
	"github.com/stratumjoin/stratum/internal/wire"
)

const (
	createPath = "/api/compute/joinTokens/create"
	listPath   = "/api/compute/joinTokens/list"
	revokePath = "/api/compute/joinTokens/revoke"
)

var tokenIDRE = regexp.MustCompile(`^jt_[0-9a-hjkmnp-tv-z]{26,52}$`)

// body builds a request body from a base and changes: a nil value
// removes the field.
func body(base map[string]any, changes ...any) map[string]any {
	out := map[string]any{}
	for k, v := range base {
		out[k] = v
	}
	for i := 0; i+1 < len(changes); i += 2 {
		if changes[i+1] == nil {
			delete(out, changes[i].(string))
		} else {
			out[changes[i].(string)] = changes[i+1]
		}
	}
	return out
}

func createBody(changes ...any) map[string]any {
	return body(map[string]any{"tenantId": "acme", "poolId": "pool-a", "ttlSeconds": 600, "idempotencyKey": "table"}, changes...)
}

// TestJoinTokensSeed000 walks every input constraint and every error of
// the joinTokens API, checking status, error shape and code.
func TestJoinTokensSeed000(t *testing.T) {
	e := newEnv(t)
	all := e.apiKey("acme", []string{"compute:join-tokens:create@compute-pool/*", "compute:join-tokens:read@compute-pool/*", "compute:join-tokens:revoke@compute-pool/*"})
	onlyK8s := e.apiKey("acme", []string{"compute:join-tokens:create@compute-pool/pool-k8s", "compute:join-tokens:read@compute-pool/pool-k8s", "compute:join-tokens:revoke@compute-pool/pool-k8s"})
	revoked := e.apiKey("acme", []string{"compute:join-tokens:create@compute-pool/*"})
	if _, err := e.l.Admin.RevokeAPIKey(context.Background(), apiKeyID(revoked)); err != nil {
		t.Fatal(err)
	}
	// a token of pool-k8s, to revoke from the wrong pool
	r := e.do(admin, "POST", createPath, createBody("poolId", "pool-k8s", "idempotencyKey", "other-pool"))
	if r.status != 200 {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	k8sToken := r.json(t)["id"].(string)
	// a token to retry against
	r = e.do(bearer(all), "POST", createPath, createBody("idempotencyKey", "retry", "expect", map[string]any{"serial": "SN-1"}, "hosted", "kubernetes"))
	if r.status != 200 {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	retryBody := func(changes ...any) map[string]any {
		return createBody(append([]any{"idempotencyKey", "retry", "expect", map[string]any{"serial": "SN-1"}, "hosted", "kubernetes"}, changes...)...)
	}
	long := func(n int) string { return strings.Repeat("a", n) }
	unknownToken := "jt_" + strings.Repeat("0", 52)

	cases := []struct {
		name   string
		caller caller
		method string
		path   string
		body   any
		want   want // status 200: success
		header []string
	}{
		// create: input constraints
		{name: "create ok", caller: bearer(all), path: createPath, body: createBody("idempotencyKey", "ok-1"), want: want{status: 200}},
		{name: "tenantId missing", caller: bearer(all), path: createPath, body: createBody("tenantId", nil), want: want{400, "INVALID_INPUT", "tenantId"}},
		{name: "tenantId too long", caller: admin, path: createPath, body: createBody("tenantId", long(129)), want: want{400, "INVALID_INPUT", "tenantId"}},
		{name: "tenantId bad character", caller: admin, path: createPath, body: createBody("tenantId", "acme/x"), want: want{400, "INVALID_INPUT", "tenantId"}},
		{name: "tenantId 128 characters", caller: admin, path: createPath, body: createBody("tenantId", long(128)), want: want{404, "NOT_FOUND", ""}},
		{name: "poolId missing", caller: bearer(all), path: createPath, body: createBody("poolId", nil), want: want{400, "INVALID_INPUT", "poolId"}},
		{name: "poolId leading dot", caller: bearer(all), path: createPath, body: createBody("poolId", ".pool"), want: want{400, "INVALID_INPUT", "poolId"}},
		{name: "poolId too long", caller: bearer(all), path: createPath, body: createBody("poolId", long(129)), want: want{400, "INVALID_INPUT", "poolId"}},
		{name: "maxUses 0", caller: bearer(all), path: createPath, body: createBody("maxUses", 0), want: want{400, "INVALID_INPUT", "maxUses"}},
		{name: "maxUses 10001", caller: bearer(all), path: createPath, body: createBody("maxUses", 10001), want: want{400, "INVALID_INPUT", "maxUses"}},
		{name: "maxUses 10000", caller: bearer(all), path: createPath, body: createBody("maxUses", 10000, "idempotencyKey", "max"), want: want{status: 200}},
		{name: "maxUses not an integer", caller: bearer(all), path: createPath, body: createBody("maxUses", 1.5), want: want{400, "INVALID_INPUT", "maxUses"}},
		{name: "maxUses a string", caller: bearer(all), path: createPath, body: createBody("maxUses", "3"), want: want{400, "INVALID_INPUT", "maxUses"}},
		{name: "ttlSeconds missing", caller: bearer(all), path: createPath, body: createBody("ttlSeconds", nil), want: want{400, "INVALID_INPUT", "ttlSeconds"}},
		{name: "ttlSeconds 59", caller: bearer(all), path: createPath, body: createBody("ttlSeconds", 59), want: want{400, "INVALID_INPUT", "ttlSeconds"}},
		{name: "ttlSeconds 86401", caller: bearer(all), path: createPath, body: createBody("ttlSeconds", 86401), want: want{400, "INVALID_INPUT", "ttlSeconds"}},
		{name: "ttlSeconds 60", caller: bearer(all), path: createPath, body: createBody("ttlSeconds", 60, "idempotencyKey", "ttl-min"), want: want{status: 200}},
		{name: "ttlSeconds 86400", caller: bearer(all), path: createPath, body: createBody("ttlSeconds", 86400, "idempotencyKey", "ttl-max"), want: want{status: 200}},
		{name: "expect empty", caller: bearer(all), path: createPath, body: createBody("expect", map[string]any{}), want: want{400, "INVALID_INPUT", "expect"}},
		{name: "expect only empty strings", caller: bearer(all), path: createPath, body: createBody("expect", map[string]any{"serial": ""}), want: want{400, "INVALID_INPUT", "expect"}},
		{name: "expect.productUuid bad", caller: bearer(all), path: createPath, body: createBody("expect", map[string]any{"productUuid": "xyz-not-hex"}), want: want{400, "INVALID_INPUT", "expect.productUuid"}},
		{name: "expect.productUuid too long", caller: bearer(all), path: createPath, body: createBody("expect", map[string]any{"productUuid": strings.Repeat("A", 65)}), want: want{400, "INVALID_INPUT", "expect.productUuid"}},
		{name: "expect.productUuid placeholder", caller: bearer(all), path: createPath, body: createBody("expect", map[string]any{"productUuid": "03000200-0400-0500-0006-000700080009"}), want: want{400, "INVALID_INPUT", "expect.productUuid"}},
		{name: "expect.serial bad", caller: bearer(all), path: createPath, body: createBody("expect", map[string]any{"serial": "has space"}), want: want{400, "INVALID_INPUT", "expect.serial"}},
		{name: "expect.serial too long", caller: bearer(all), path: createPath, body: createBody("expect", map[string]any{"serial": long(129)}), want: want{400, "INVALID_INPUT", "expect.serial"}},
		{name: "expect.mac short", caller: bearer(all), path: createPath, body: createBody("expect", map[string]any{"mac": "00:11:22:33:44"}), want: want{400, "INVALID_INPUT", "expect.mac"}},
		{name: "expect.mac dashes", caller: bearer(all), path: createPath, body: createBody("expect", map[string]any{"mac": "00-11-22-33-44-55"}), want: want{400, "INVALID_INPUT", "expect.mac"}},
		{name: "expect.gpuUuid bad", caller: bearer(all), path: createPath, body: createBody("expect", map[string]any{"gpuUuid": "gpu-0123abcd"}), want: want{400, "INVALID_INPUT", "expect.gpuUuid"}},
		{name: "expect.gpuUuid too long", caller: bearer(all), path: createPath, body: createBody("expect", map[string]any{"gpuUuid": "GPU-" + strings.Repeat("a", 65)}), want: want{400, "INVALID_INPUT", "expect.gpuUuid"}},
		{name: "expect.ekHash short", caller: bearer(all), path: createPath, body: createBody("expect", map[string]any{"ekHash": "abc123"}), want: want{400, "INVALID_INPUT", "expect.ekHash"}},
		{name: "expect.ekHash alone", caller: bearer(all), path: createPath, body: createBody("idempotencyKey", "pinned-ek", "expect", map[string]any{"ekHash": strings.Repeat("0a", 32)}), want: want{status: 200}},
		{name: "expect unknown identifier", caller: bearer(all), path: createPath, body: createBody("expect", map[string]any{"hostname": "x"}), want: want{400, "INVALID_INPUT", "expect.hostname"}},
		{name: "expect all four", caller: bearer(all), path: createPath, body: createBody("idempotencyKey", "pinned-4", "expect", map[string]any{"productUuid": "4c4c4544-0042-3510-8052-b2c04f4e4d32", "serial": "7XJ2KQ3", "mac": "B8:CE:F6:01:02:03", "gpuUuid": "GPU-1f2e3d4c-0000-1111-2222-333344445555"}), want: want{status: 200}},
		{name: "allowReclaim not a boolean", caller: bearer(all), path: createPath, body: createBody("allowReclaim", "yes"), want: want{400, "INVALID_INPUT", "allowReclaim"}},
		{name: "hosted not kubernetes", caller: bearer(all), path: createPath, body: createBody("hosted", "docker"), want: want{400, "INVALID_INPUT", "hosted"}},
		{name: "hosted empty", caller: bearer(all), path: createPath, body: createBody("hosted", ""), want: want{400, "INVALID_INPUT", "hosted"}},
		{name: "idempotencyKey missing", caller: bearer(all), path: createPath, body: createBody("idempotencyKey", nil), want: want{400, "INVALID_INPUT", "idempotencyKey"}},
		{name: "idempotencyKey bad character", caller: bearer(all), path: createPath, body: createBody("idempotencyKey", "a b"), want: want{400, "INVALID_INPUT", "idempotencyKey"}},
		{name: "idempotencyKey too long", caller: bearer(all), path: createPath, body: createBody("idempotencyKey", long(129)), want: want{400, "INVALID_INPUT", "idempotencyKey"}},
		{name: "idempotencyKey every allowed character", caller: bearer(all), path: createPath, body: createBody("idempotencyKey", "aZ09._~:/+=-"), want: want{status: 200}},
		{name: "unknown field", caller: bearer(all), path: createPath, body: createBody("role", "node"), want: want{400, "INVALID_INPUT", "role"}},
		{name: "trailing data", caller: bearer(all), path: createPath, body: `{"tenantId":"acme","poolId":"pool-a","ttlSeconds":600,"idempotencyKey":"t"} {}`, want: want{400, "INVALID_INPUT", ""}},
		{name: "not JSON", caller: bearer(all), path: createPath, body: `tenantId=acme`, want: want{400, "INVALID_INPUT", ""}},
		{name: "empty body", caller: bearer(all), path: createPath, body: ``, want: want{400, "INVALID_INPUT", ""}},
		{name: "array body", caller: bearer(all), path: createPath, body: `[]`, want: want{400, "INVALID_INPUT", ""}},

		// create: who may call, which pool, which state
		{name: "no credentials", caller: anonymous, path: createPath, body: createBody(), want: want{401, "UNAUTHENTICATED", ""}},
		{name: "malformed bearer", caller: bearer("sjk_nope"), path: createPath, body: createBody(), want: want{401, "UNAUTHENTICATED", ""}},
		{name: "unknown api key", caller: bearer("sjk_0000000000000000_" + strings.Repeat("0", 52)), path: createPath, body: createBody(), want: want{401, "UNAUTHENTICATED", ""}},
		{name: "revoked api key", caller: bearer(revoked), path: createPath, body: createBody(), want: want{401, "UNAUTHENTICATED", ""}},
		{name: "no grant on this pool", caller: bearer(onlyK8s), path: createPath, body: createBody(), want: want{403, "PERMISSION_DENIED", ""}},
		{name: "key of another tenant", caller: bearer(all), path: createPath, body: createBody("tenantId", "globex", "poolId", "pool-g"), want: want{403, "PERMISSION_DENIED", ""}},
		{name: "another tenant's pool", caller: bearer(all), path: createPath, body: createBody("poolId", "pool-g"), want: want{404, "NOT_FOUND", ""}},
		{name: "unknown pool", caller: bearer(all), path: createPath, body: createBody("poolId", "pool-zz"), want: want{404, "NOT_FOUND", ""}},
		{name: "pool without daemon", caller: bearer(all), path: createPath, body: createBody("poolId", "pool-bare"), want: want{409, "INVALID_STATE", ""}},
		{name: "from a browser", caller: admin, path: createPath, body: createBody(), header: []string{"Origin", "https://evil.example"}, want: want{403, "PERMISSION_DENIED", ""}},
		{name: "referer", caller: bearer(all), path: createPath, body: createBody(), header: []string{"Referer", "https://evil.example/"}, want: want{403, "PERMISSION_DENIED", ""}},

		// create: idempotency
		{name: "retry", caller: bearer(all), path: createPath, body: retryBody(), want: want{status: 200}},
		{name: "retry with other maxUses and ttl", caller: bearer(all), path: createPath, body: retryBody("maxUses", 7, "ttlSeconds", 120), want: want{status: 200}},
		{name: "retry with another pool", caller: bearer(all), path: createPath, body: retryBody("poolId", "pool-k8s"), want: want{409, "CONFLICT", "poolId"}},
		{name: "retry with another expect", caller: bearer(all), path: createPath, body: retryBody("expect", map[string]any{"serial": "SN-2"}), want: want{409, "CONFLICT", "expect"}},
		{name: "retry without expect", caller: bearer(all), path: createPath, body: retryBody("expect", nil), want: want{409, "CONFLICT", "expect"}},
		{name: "retry with allowReclaim", caller: bearer(all), path: createPath, body: retryBody("allowReclaim", true), want: want{409, "CONFLICT", "allowReclaim"}},
		{name: "retry without hosted", caller: bearer(all), path: createPath, body: retryBody("hosted", nil), want: want{409, "CONFLICT", "hosted"}},
		{name: "same key by another caller", caller: admin, path: createPath, body: createBody("idempotencyKey", "retry", "poolId", "pool-k8s"), want: want{status: 200}},

		// list
		{name: "list ok", caller: bearer(all), path: listPath, body: map[string]any{"tenantId": "acme", "poolId": "pool-a"}, want: want{status: 200}},
		{name: "list tenantId missing", caller: bearer(all), path: listPath, body: map[string]any{"poolId": "pool-a"}, want: want{400, "INVALID_INPUT", "tenantId"}},
		{name: "list poolId bad", caller: bearer(all), path: listPath, body: map[string]any{"tenantId": "acme", "poolId": "-a"}, want: want{400, "INVALID_INPUT", "poolId"}},
		{name: "list limit 0", caller: bearer(all), path: listPath, body: map[string]any{"tenantId": "acme", "poolId": "pool-a", "limit": 0}, want: want{400, "INVALID_INPUT", "limit"}},
		{name: "list limit 201", caller: bearer(all), path: listPath, body: map[string]any{"tenantId": "acme", "poolId": "pool-a", "limit": 201}, want: want{400, "INVALID_INPUT", "limit"}},
		{name: "list limit 200", caller: bearer(all), path: listPath, body: map[string]any{"tenantId": "acme", "poolId": "pool-a", "limit": 200}, want: want{status: 200}},
		{name: "list cursor bad alphabet", caller: bearer(all), path: listPath, body: map[string]any{"tenantId": "acme", "poolId": "pool-a", "cursor": "jt_" + strings.Repeat("u", 26)}, want: want{400, "INVALID_INPUT", "cursor"}},
		{name: "list cursor too short", caller: bearer(all), path: listPath, body: map[string]any{"tenantId": "acme", "poolId": "pool-a", "cursor": "jt_" + strings.Repeat("0", 25)}, want: want{400, "INVALID_INPUT", "cursor"}},
		{name: "list cursor too long", caller: bearer(all), path: listPath, body: map[string]any{"tenantId": "acme", "poolId": "pool-a", "cursor": "jt_" + strings.Repeat("0", 62)}, want: want{400, "INVALID_INPUT", "cursor"}},
		{name: "list includeInactive not a boolean", caller: bearer(all), path: listPath, body: map[string]any{"tenantId": "acme", "poolId": "pool-a", "includeInactive": 1}, want: want{400, "INVALID_INPUT", "includeInactive"}},
		{name: "list unknown field", caller: bearer(all), path: listPath, body: map[string]any{"tenantId": "acme", "poolId": "pool-a", "pageSize": 3}, want: want{400, "INVALID_INPUT", "pageSize"}},
		{name: "list without read grant", caller: bearer(onlyK8s), path: listPath, body: map[string]any{"tenantId": "acme", "poolId": "pool-a"}, want: want{403, "PERMISSION_DENIED", ""}},
		{name: "list another tenant's pool", caller: bearer(all), path: listPath, body: map[string]any{"tenantId": "acme", "poolId": "pool-g"}, want: want{404, "NOT_FOUND", ""}},
		{name: "list no credentials", caller: anonymous, path: listPath, body: map[string]any{"tenantId": "acme", "poolId": "pool-a"}, want: want{401, "UNAUTHENTICATED", ""}},

		// revoke
		{name: "revoke tokenId missing", caller: bearer(all), path: revokePath, body: map[string]any{"tenantId": "acme", "poolId": "pool-a"}, want: want{400, "INVALID_INPUT", "tokenId"}},
		{name: "revoke tokenId bad", caller: bearer(all), path: revokePath, body: map[string]any{"tenantId": "acme", "poolId": "pool-a", "tokenId": "tok_1"}, want: want{400, "INVALID_INPUT", "tokenId"}},
		{name: "revoke tokenId too long", caller: bearer(all), path: revokePath, body: map[string]any{"tenantId": "acme", "poolId": "pool-a", "tokenId": "jt_" + strings.Repeat("0", 62)}, want: want{400, "INVALID_INPUT", "tokenId"}},
		{name: "revoke tenantId bad", caller: bearer(all), path: revokePath, body: map[string]any{"tenantId": "a b", "poolId": "pool-a", "tokenId": unknownToken}, want: want{400, "INVALID_INPUT", "tenantId"}},
		{name: "revoke unknown token", caller: bearer(all), path: revokePath, body: map[string]any{"tenantId": "acme", "poolId": "pool-a", "tokenId": unknownToken}, want: want{404, "NOT_FOUND", ""}},
		{name: "revoke token of another pool", caller: bearer(all), path: revokePath, body: map[string]any{"tenantId": "acme", "poolId": "pool-a", "tokenId": k8sToken}, want: want{404, "NOT_FOUND", ""}},
		{name: "revoke in another tenant's pool", caller: bearer(all), path: revokePath, body: map[string]any{"tenantId": "acme", "poolId": "pool-g", "tokenId": unknownToken}, want: want{404, "NOT_FOUND", ""}},
		{name: "revoke without revoke grant", caller: bearer(onlyK8s), path: revokePath, body: map[string]any{"tenantId": "acme", "poolId": "pool-a", "tokenId": unknownToken}, want: want{403, "PERMISSION_DENIED", ""}},
		{name: "revoke ok", caller: bearer(onlyK8s), path: revokePath, body: map[string]any{"tenantId": "acme", "poolId": "pool-k8s", "tokenId": k8sToken}, want: want{status: 200}},

		// routing
		{name: "GET on create", caller: bearer(all), method: "GET", path: createPath, want: want{405, "METHOD_NOT_ALLOWED", ""}},
		{name: "unknown method route", caller: bearer(all), path: "/api/compute/joinTokens/delete", body: map[string]any{}, want: want{404, "NOT_FOUND", ""}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			method := c.method
			if method == "" {
				method = "POST"
			}
			r := e.do(c.caller, method, c.path, c.body, c.header...)
			if c.want.status == 200 {
				if r.status != 200 {
					t.Fatalf("status %d: %s", r.status, r.body)
				}
				return
			}
			checkTokenError(t, r, c.want)
		})
	}
}

// TestJoinTokenLifecycle creates, lists and revokes a token, joins a real
// agent with it, and checks the events: one created, one revoked.
func TestJoinTokenLifecycle(t *testing.T) {
	e := newEnv(t)
	key := e.apiKey("acme", []string{"compute:join-tokens:create@compute-pool/pool-a", "compute:join-tokens:read@compute-pool/pool-a", "compute:join-tokens:revoke@compute-pool/pool-a"})
	r := e.do(bearer(key), "POST", createPath, createBody("idempotencyKey", "life", "maxUses", 5))
	if r.status != 200 {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	var tok struct {
		ID, TenantID, PoolID, Role, Trust, State, Token, ExpiresAt, CreatedAt string
		MaxUses, Uses                                                         int
		RevokedAt                                                             *string
	}
	r.decode(t, &tok)
	if !tokenIDRE.MatchString(tok.ID) || !strings.HasPrefix(tok.Token, "bcjt_"+tok.ID+".") {
		t.Fatalf("id %q token %q", tok.ID, tok.Token)
	}
	if tok.TenantID != "acme" || tok.PoolID != "pool-a" || tok.Role != "node" || tok.Trust != "platform" || tok.State != "live" || tok.MaxUses != 5 || tok.RevokedAt != nil {
		t.Fatalf("record %+v", tok)
	}

	// the default maxUses is 1
	r = e.do(bearer(key), "POST", createPath, createBody("idempotencyKey", "default-uses"))
	if got := r.json(t)["maxUses"]; got != 1.0 {
		t.Errorf("default maxUses %v", got)
	}

	list := func(includeInactive bool) []map[string]any {
		t.Helper()
		r := e.do(bearer(key), "POST", listPath, map[string]any{"tenantId": "acme", "poolId": "pool-a", "includeInactive": includeInactive})
		if r.status != 200 {
			t.Fatalf("list: %d %s", r.status, r.body)
		}
		if strings.Contains(string(r.body), "bcjt_") || strings.Contains(string(r.body), `"token"`) {
			t.Fatalf("a list shows a secret: %s", r.body)
		}
		var out []map[string]any
		for _, it := range r.json(t)["items"].([]any) {
			out = append(out, it.(map[string]any))
		}
		return out
	}
	if items := list(false); len(items) != 2 || !slices.ContainsFunc(items, func(m map[string]any) bool { return m["id"] == tok.ID }) {
		t.Fatalf("list: %v", items)
	}

	j := e.mustJoin(tok.Token, machine("4c4c4544-0042-3510-8052-b2c04f4e4d32", "node-1"))
	if j.Identity.Trust != "platform" || j.Identity.Role != "node" {
		t.Errorf("joined as %s/%s", j.Identity.Role, j.Identity.Trust)
	}

	r = e.do(bearer(key), "POST", revokePath, map[string]any{"tenantId": "acme", "poolId": "pool-a", "tokenId": tok.ID})
	if r.status != 200 {
		t.Fatalf("revoke: %d %s", r.status, r.body)
	}
	first := r.json(t)
	if first["revokedAt"] == nil || first["state"] != "revoked" || first["uses"] != 1.0 || first["token"] != nil {
		t.Fatalf("revoked record %s", r.body)
	}
	again := e.do(bearer(key), "POST", revokePath, map[string]any{"tenantId": "acme", "poolId": "pool-a", "tokenId": tok.ID})
	if again.status != 200 || again.json(t)["revokedAt"] != first["revokedAt"] {
		t.Fatalf("second revoke changed the record: %s", again.body)
	}

	_, err := e.join(tok.Token, machine("4c4c4544-0042-3510-8052-b2c04f4e4d33", "node-2"))
	var refused *agent.RefusedError
	if !errors.As(err, &refused) || refused.Code != wire.CodeRevoked {
		t.Fatalf("join after revoke: %v, want %s", err, wire.CodeRevoked)
	}

	if items := list(false); len(items) != 1 || items[0]["id"] == tok.ID {
		t.Fatalf("live list still shows the revoked token: %v", items)
	}
	if items := list(true); len(items) != 2 {
		t.Fatalf("includeInactive list: %v", items)
	}

	created, revokedEvs := e.events(cluster.EventTokenCreated), e.events(cluster.EventTokenRevoked)
	if n := countFor(created, tok.ID); n != 1 {
		t.Errorf("%d created events for the token", n)
	}
	if n := countFor(revokedEvs, tok.ID); n != 1 {
		t.Errorf("%d revoked events for the token, want 1", n)
	}
	for _, ev := range created {
		if ev.Fields["id"] == tok.ID && (ev.Fields["pinned"] != false || ev.Fields["poolId"] != "pool-a" || ev.Actor == "") {
			t.Errorf("created event %+v", ev)
		}
		if _, ok := ev.Fields["hosted"]; ok {
			t.Errorf("hosted in an event of an unhosted token: %+v", ev)
		}
	}
}

func countFor(evs []cluster.Event, id string) int {
	n := 0
	for _, ev := range evs {
		if ev.Fields["id"] == id {
			n++
		}
	}
	return n
}

// TestJoinTokenIdempotency: 20 concurrent creates with one idempotencyKey
// store one token; exactly one answer carries the secret; the event is
// published once; a retry with another pool is CONFLICT without an
// authorization decision on that pool.
func TestJoinTokenIdempotency(t *testing.T) {
	e := newEnv(t)
	key := e.apiKey("acme", []string{"compute:join-tokens:create@compute-pool/pool-a"})
	req := createBody("idempotencyKey", "deploy-42", "expect", map[string]any{"productUuid": "4c4c4544-0042-3510-8052-b2c04f4e4d32"}, "hosted", "kubernetes", "maxUses", 2)
	const n = 20
	var wg sync.WaitGroup
	answers := make([]response, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			answers[i] = e.do(bearer(key), "POST", createPath, req)
		}()
	}
	wg.Wait()
	ids := map[string]bool{}
	var secrets []string
	for _, a := range answers {
		if a.status != 200 {
			t.Fatalf("create: %d %s", a.status, a.body)
		}
		m := a.json(t)
		ids[m["id"].(string)] = true
		if s, ok := m["token"].(string); ok {
			secrets = append(secrets, s)
		}
	}
	if len(ids) != 1 || len(secrets) != 1 {
		t.Fatalf("%d ids and %d secrets from %d retries, want 1 and 1", len(ids), len(secrets), n)
	}
	var id string
	for k := range ids {
		id = k
	}
	created := e.events(cluster.EventTokenCreated)
	if len(created) != 1 || created[0].Fields["id"] != id || created[0].Fields["pinned"] != true || created[0].Fields["maxUses"] != 2.0 || created[0].Fields["hosted"] != "kubernetes" {
		t.Fatalf("created events %+v, want one with pinned=true hosted=kubernetes", created)
	}

	// The key has no grant on pool-k8s, so a fresh decision would be
	// PERMISSION_DENIED; a retry is decided on the stored record alone.
	checkTokenError(t, e.do(bearer(key), "POST", createPath, body(req, "poolId", "pool-k8s")), want{409, "CONFLICT", "poolId"})
	if r := e.do(bearer(key), "POST", createPath, body(req, "poolId", "pool-k8s", "idempotencyKey", "fresh")); r.status != 403 {
		t.Fatalf("a fresh create on an ungranted pool: %d %s", r.status, r.body)
	}

	// the secret joins the pinned machine only
	_, err := e.join(secrets[0], machine("4c4c4544-0042-3510-8052-b2c04f4e4d99", "other"))
	var refused *agent.RefusedError
	if !errors.As(err, &refused) || refused.Code != wire.CodeIdentityMismatch {
		t.Fatalf("join from another machine: %v", err)
	}
	e.mustJoin(secrets[0], machine("4C4C4544-0042-3510-8052-B2C04F4E4D32", "pinned"))
	if len(e.events(cluster.EventTokenCreated)) != 1 {
		t.Fatal("joins published another created event")
	}

	// concurrent revokes: one revocation, one event, one revokedAt
	revoker := e.apiKey("acme", []string{"compute:join-tokens:revoke@compute-pool/pool-a"})
	revokedAt := make([]any, 10)
	for i := range revokedAt {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := e.do(bearer(revoker), "POST", revokePath, map[string]any{"tenantId": "acme", "poolId": "pool-a", "tokenId": id})
			if r.status == 200 {
				revokedAt[i] = r.json(t)["revokedAt"]
			}
		}()
	}
	wg.Wait()
	for _, at := range revokedAt {
		if at == nil || at != revokedAt[0] {
			t.Fatalf("revokes answered %v", revokedAt)
		}
	}
	if evs := e.events(cluster.EventTokenRevoked); len(evs) != 1 || evs[0].Fields["id"] != id {
		t.Fatalf("revoked events %+v", evs)
	}
}

// TestJoinTokenTrust: the token's hosted flag and the pool's site and
// policy decide the node's trust and its certificate's role (docs/architecture.md
// section 6); the certificate says the role in its SPIFFE id.
func TestJoinTokenTrust(t *testing.T) {
	e := newEnv(t)
	cases := []struct {
		pool, hosted string
		role, trust  string
	}{
		{"pool-a", "", "node", "platform"},
		{"pool-a", "kubernetes", "node-tenant", "tenant-controlled"},
		{"pool-k8s", "kubernetes", "node", "platform"},                 // platform-owned, not custom, platformOperated
		{"pool-lab", "kubernetes", "node-tenant", "tenant-controlled"}, // platform-owned but custom
		{"pool-own", "", "node", "tenant-owned"},
		{"pool-own", "kubernetes", "node-tenant", "tenant-owned"}, // hosted never raises, nor lowers a tenant's own site
	}
	for i, c := range cases {
		t.Run(c.pool+"/"+c.hosted, func(t *testing.T) {
			b := createBody("poolId", c.pool, "idempotencyKey", "trust-"+c.pool+c.hosted)
			if c.hosted != "" {
				b["hosted"] = c.hosted
			}
			r := e.do(admin, "POST", createPath, b)
			if r.status != 200 {
				t.Fatalf("create: %d %s", r.status, r.body)
			}
			m := r.json(t)
			if m["role"] != c.role || m["trust"] != c.trust {
				t.Errorf("record says %v/%v", m["role"], m["trust"])
			}
			j := e.mustJoin(m["token"].(string), machine("4c4c4544-0042-3510-8052-b2c04f4e4d4"+string(rune('0'+i)), "trust"))
			if j.Identity.Role != c.role || j.Identity.Trust != c.trust {
				t.Errorf("joined as %s/%s, want %s/%s", j.Identity.Role, j.Identity.Trust, c.role, c.trust)
			}
			leaf := j.Chain[0]
			if len(leaf.URIs) != 1 || !strings.Contains(leaf.URIs[0].Path, "/"+c.role+"/") {
				t.Errorf("certificate URI %v, want role %s", leaf.URIs, c.role)
			}
			n, err := e.l.Cluster().Node(context.Background(), j.Identity.NodeID)
			if err != nil || n.Trust != c.trust || n.Tenant != "acme" || n.Pool != c.pool {
				t.Errorf("node record %+v %v", n, err)
			}
		})
	}
}

// TestJoinTokenListPages reads a pool's tokens a page at a time, in id
// order, live ones only unless includeInactive.
func TestJoinTokenListPages(t *testing.T) {
	e := newEnv(t)
	var ids []string
	for i := range 5 {
		r := e.do(admin, "POST", createPath, createBody("idempotencyKey", "page-"+string(rune('a'+i))))
		if r.status != 200 {
			t.Fatalf("create: %d %s", r.status, r.body)
		}
		ids = append(ids, r.json(t)["id"].(string))
	}
	// another pool's token never shows
	e.do(admin, "POST", createPath, createBody("poolId", "pool-k8s", "idempotencyKey", "elsewhere"))
	slices.Sort(ids)
	if r := e.do(admin, "POST", revokePath, map[string]any{"tenantId": "acme", "poolId": "pool-a", "tokenId": ids[1]}); r.status != 200 {
		t.Fatal(r.status)
	}
	read := func(includeInactive bool) []string {
		var got []string
		cursor := ""
		for range 10 {
			b := map[string]any{"tenantId": "acme", "poolId": "pool-a", "limit": 2, "includeInactive": includeInactive}
			if cursor != "" {
				b["cursor"] = cursor
			}
			r := e.do(admin, "POST", listPath, b)
			if r.status != 200 {
				t.Fatalf("list: %d %s", r.status, r.body)
			}
			var page struct {
				Items  []struct{ ID string }
				Cursor string
			}
			r.decode(t, &page)
			if len(page.Items) > 2 {
				t.Fatalf("page of %d", len(page.Items))
			}
			for _, it := range page.Items {
				got = append(got, it.ID)
			}
			if page.Cursor == "" {
				return got
			}
			cursor = page.Cursor
		}
		t.Fatal("no last page")
		return nil
	}
	if got, want := read(true), ids; !slices.Equal(got, want) {
		t.Errorf("all pages %v, want %v", got, want)
	}
	if got, want := read(false), slices.Delete(slices.Clone(ids), 1, 2); !slices.Equal(got, want) {
		t.Errorf("live pages %v, want %v", got, want)
	}
	// an expired token leaves the live list
	e.clock.advance(601e9)
	if got := read(false); len(got) != 0 {
		t.Errorf("expired tokens listed as live: %v", got)
	}
	r := e.do(admin, "POST", listPath, map[string]any{"tenantId": "acme", "poolId": "pool-a", "includeInactive": true})
	for _, it := range r.json(t)["items"].([]any) {
		st := it.(map[string]any)["state"]
		if st != "expired" && st != "revoked" {
			t.Errorf("state %v after expiry", st)
		}
	}
}
