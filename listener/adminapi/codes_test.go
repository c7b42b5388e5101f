package adminapi_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stratumjoin/stratum/agent"
	"github.com/stratumjoin/stratum/internal/cluster"
	"github.com/stratumjoin/stratum/internal/wire"
)

const codesPath = "/v1/admin/cluster/join-codes"

// TestJoinCodesSeed004 walks the join-codes routes' constraints and errors:
// application/problem+json with type, title, status, code and requestId.
func TestJoinCodesSeed004(t *testing.T) {
	e := newEnv(t)
	describe := e.apiKey("acme", []string{"ha:DescribeJoinCodes@cluster"})
	full := e.apiKey("acme", []string{"ha:DescribeJoinCodes@cluster", "ha:CreateJoinCode@cluster", "ha:RevokeJoinCode@*"})
	tokensOnly := e.apiKey("acme", []string{"compute:join-tokens:create@*"})
	globexCode := e.do(admin, "POST", codesPath, map[string]any{"pool": "pool-g"}).json(t)["id"].(string)

	cases := []struct {
		name         string
		caller       caller
		method, path string
		body         any
		want         want
		header       []string
	}{
		{name: "list", caller: admin, method: "GET", path: codesPath, want: want{status: 200}},
		{name: "list with the action", caller: bearer(describe), method: "GET", path: codesPath, want: want{status: 200}},
		{name: "list without credentials", caller: anonymous, method: "GET", path: codesPath, want: want{401, "UNAUTHORIZED", ""}},
		{name: "list without ha:DescribeJoinCodes", caller: bearer(tokensOnly), method: "GET", path: codesPath, want: want{403, "FORBIDDEN", ""}},
		{name: "list from a browser", caller: admin, method: "GET", path: codesPath, header: []string{"Origin", "http://localhost"}, want: want{403, "FORBIDDEN", ""}},
		{name: "mint", caller: bearer(full), method: "POST", path: codesPath, body: map[string]any{"pool": "pool-a"}, want: want{status: 201}},
		{name: "mint without the action", caller: bearer(describe), method: "POST", path: codesPath, body: map[string]any{}, want: want{403, "FORBIDDEN", ""}},
		{name: "mint ttl 59", caller: admin, method: "POST", path: codesPath, body: map[string]any{"ttlSeconds": 59}, want: want{400, "INVALID_INPUT", "ttlSeconds"}},
		{name: "mint ttl past 30 days", caller: admin, method: "POST", path: codesPath, body: map[string]any{"ttlSeconds": 30*86400 + 1}, want: want{400, "INVALID_INPUT", "ttlSeconds"}},
		{name: "mint maxUses -1", caller: admin, method: "POST", path: codesPath, body: map[string]any{"maxUses": -1}, want: want{400, "INVALID_INPUT", "maxUses"}},
		{name: "mint maxUses 10001", caller: admin, method: "POST", path: codesPath, body: map[string]any{"maxUses": 10001}, want: want{400, "INVALID_INPUT", "maxUses"}},
		{name: "mint pool bad", caller: admin, method: "POST", path: codesPath, body: map[string]any{"pool": "a/b"}, want: want{400, "INVALID_INPUT", "pool"}},
		{name: "mint hosted bad", caller: admin, method: "POST", path: codesPath, body: map[string]any{"hosted": "nomad"}, want: want{400, "INVALID_INPUT", "hosted"}},
		{name: "mint expect empty", caller: admin, method: "POST", path: codesPath, body: map[string]any{"expect": map[string]any{}}, want: want{400, "INVALID_INPUT", "expect"}},
		{name: "mint expect bad mac", caller: admin, method: "POST", path: codesPath, body: map[string]any{"expect": map[string]any{"mac": "zz"}}, want: want{400, "INVALID_INPUT", "expect.mac"}},
		{name: "mint unknown field", caller: admin, method: "POST", path: codesPath, body: map[string]any{"code": "4F7K2-Q9MXZ-T"}, want: want{400, "INVALID_INPUT", "code"}},
		{name: "mint not JSON", caller: admin, method: "POST", path: codesPath, body: "{", want: want{400, "INVALID_INPUT", ""}},
		{name: "mint unknown pool", caller: admin, method: "POST", path: codesPath, body: map[string]any{"pool": "pool-zz"}, want: want{404, "NOT_FOUND", ""}},
		{name: "mint another tenant's pool", caller: bearer(full), method: "POST", path: codesPath, body: map[string]any{"pool": "pool-g"}, want: want{404, "NOT_FOUND", ""}},
		{name: "mint pool without daemon", caller: admin, method: "POST", path: codesPath, body: map[string]any{"pool": "pool-bare"}, want: want{409, "INVALID_STATE", ""}},
		{name: "get unknown", caller: admin, method: "GET", path: codesPath + "/jc-nope", want: want{404, "NOT_FOUND", ""}},
		{name: "get another tenant's", caller: bearer(describe), method: "GET", path: codesPath + "/" + globexCode, want: want{404, "NOT_FOUND", ""}},
		{name: "revoke unknown", caller: admin, method: "POST", path: codesPath + "/jc-nope/revoke", want: want{404, "NOT_FOUND", ""}},
		{name: "revoke another tenant's", caller: bearer(full), method: "POST", path: codesPath + "/" + globexCode + "/revoke", want: want{404, "NOT_FOUND", ""}},
		{name: "revoke without the action", caller: bearer(describe), method: "POST", path: codesPath + "/" + globexCode + "/revoke", want: want{403, "FORBIDDEN", ""}},
		{name: "DELETE", caller: admin, method: "DELETE", path: codesPath, want: want{405, "METHOD_NOT_ALLOWED", ""}},
		{name: "unknown route", caller: admin, method: "GET", path: "/v1/admin/cluster/secrets", want: want{404, "NOT_FOUND", ""}},
		{name: "admin route with an api key", caller: bearer(full), method: "GET", path: "/v1/admin/cluster/nodes", want: want{403, "FORBIDDEN", ""}},
		{name: "api keys route with an api key", caller: bearer(full), method: "POST", path: "/v1/admin/api-keys", body: map[string]any{"tenant": "acme", "scopes": []string{"join-keys:create"}}, want: want{403, "FORBIDDEN", ""}},
		{name: "events without credentials", caller: anonymous, method: "GET", path: "/v1/admin/cluster/events", want: want{401, "UNAUTHORIZED", ""}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := e.do(c.caller, c.method, c.path, c.body, c.header...)
			if c.want.status < 300 {
				if r.status != c.want.status {
					t.Fatalf("status %d: %s", r.status, r.body)
				}
				return
			}
			checkProblem(t, r, c.want)
		})
	}
}

// TestJoinCodesList: newest first, with every field of the join-codes API, in each
// of the states live, expired and revoked (burned included); a key of a
// tenant sees that tenant's codes only.
func TestJoinCodesList(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	mint := func(b map[string]any) map[string]any {
		r := e.do(admin, "POST", codesPath, b)
		if r.status != 201 {
			t.Fatalf("mint: %d %s", r.status, r.body)
		}
		return r.json(t)
	}
	short := mint(map[string]any{"ttlSeconds": 60, "pool": "pool-a"})
	burned := mint(map[string]any{"pool": "pool-a"})
	revoked := mint(map[string]any{"pool": "pool-a"})
	used := mint(map[string]any{"pool": "pool-a", "maxUses": 5, "autoApprove": true})
	other := mint(map[string]any{"pool": "pool-g"})

	e.mustJoin(used["code"].(string), machine("4c4c4544-0000-0000-0000-0000000cc001", "c1"))
	r := e.do(admin, "POST", codesPath+"/"+revoked["id"].(string)+"/revoke", nil)
	if r.status != 200 || r.json(t)["revokedBy"] != adminActor {
		t.Fatalf("revoke: %d %s", r.status, r.body)
	}
	// eleven exchanges that never prove the code burn it
	for range cluster.MaxUnproven + 1 {
		att, err := e.l.Cluster().BeginAttempt(ctx, burned["selector"].(string))
		if err != nil {
			t.Fatal(err)
		}
		if err := e.l.Cluster().Abandon(ctx, att); err != nil {
			t.Fatal(err)
		}
	}
	e.clock.advance(90 * time.Second)

	r = e.do(admin, "GET", codesPath, nil)
	if r.status != 200 || strings.Contains(string(r.body), `"code"`) {
		t.Fatalf("list: %d %s", r.status, r.body)
	}
	items := r.json(t)["items"].([]any)
	if len(items) != 5 {
		t.Fatalf("%d codes", len(items))
	}
	wantOrder := []string{other["id"].(string), used["id"].(string), revoked["id"].(string), burned["id"].(string), short["id"].(string)}
	byID := map[string]map[string]any{}
	for i, it := range items {
		c := it.(map[string]any)
		byID[c["id"].(string)] = c
		if c["id"] != wantOrder[i] {
			t.Errorf("item %d is %v, want %s (newest first)", i, c["id"], wantOrder[i])
		}
		for _, f := range []string{"id", "selector", "failedAttempts", "endpoint", "caFingerprint", "state", "createdBy", "createdAt", "expiresAt", "registrations"} {
			if _, ok := c[f]; !ok {
				t.Errorf("code %v lacks %s", c["id"], f)
			}
		}
		if c["endpoint"] != e.l.Endpoint || len(c["caFingerprint"].(string)) != 95 || c["createdBy"] != adminActor {
			t.Errorf("code %v: endpoint %v fingerprint %v createdBy %v", c["id"], c["endpoint"], c["caFingerprint"], c["createdBy"])
		}
	}
	check := func(id, state, revokedBy string, failed, registrations float64) {
		t.Helper()
		c := byID[id]
		if c["state"] != state || c["failedAttempts"] != failed || c["registrations"] != registrations {
			t.Errorf("code %s: %v failed %v registrations %v, want %s %v %v", id, c["state"], c["failedAttempts"], c["registrations"], state, failed, registrations)
		}
		if revokedBy != "" && (c["revokedBy"] != revokedBy || c["revokedAt"] == nil) {
			t.Errorf("code %s revoked by %v at %v, want %s", id, c["revokedBy"], c["revokedAt"], revokedBy)
		}
	}
	check(short["id"].(string), "expired", "", 0, 0)
	check(burned["id"].(string), "revoked", cluster.BurnedBy, cluster.MaxUnproven, 0)
	check(revoked["id"].(string), "revoked", adminActor, 0, 0)
	check(used["id"].(string), "live", "", 0, 1)

	describe := e.apiKey("acme", []string{"ha:DescribeJoinCodes@cluster"})
	r = e.do(bearer(describe), "GET", codesPath, nil)
	if n := len(r.json(t)["items"].([]any)); n != 4 || strings.Contains(string(r.body), other["id"].(string)) {
		t.Errorf("acme's key sees %d codes: %s", n, r.body)
	}

	// a revoked code is refused to a machine that proves it
	_, err := e.join(revoked["code"].(string), machine("4c4c4544-0000-0000-0000-0000000cc002", "c2"))
	var refused *agent.RefusedError
	if !errors.As(err, &refused) || refused.Code != wire.CodeRevoked {
		t.Fatalf("join with a revoked code: %v", err)
	}
}

// TestResetAttempts: `reset-attempts` drops a live code's failed count to
// 0 and records who did it; a code that is not live is refused.
func TestResetAttempts(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	r := e.do(admin, "POST", codesPath, map[string]any{"pool": "pool-a", "maxUses": 0})
	code := r.json(t)
	for range 4 {
		att, err := e.l.Cluster().BeginAttempt(ctx, code["selector"].(string))
		if err != nil {
			t.Fatal(err)
		}
		if err := e.l.Cluster().Abandon(ctx, att); err != nil {
			t.Fatal(err)
		}
	}
	id := code["id"].(string)
	if got := e.do(admin, "GET", codesPath+"/"+id, nil).json(t)["failedAttempts"]; got != float64(4) {
		t.Fatalf("failedAttempts %v before the reset, want 4", got)
	}
	r = e.do(admin, "POST", codesPath+"/"+id+"/reset-attempts", nil)
	if r.status != 200 || r.json(t)["failedAttempts"] != float64(0) {
		t.Fatalf("reset: %d %s", r.status, r.body)
	}
	evs := e.events(cluster.EventAttemptsReset)
	if len(evs) != 1 || evs[0].Actor != adminActor || evs[0].Fields["failedAttemptsBefore"] != float64(4) || evs[0].Fields["id"] != id {
		t.Fatalf("reset events %+v", evs)
	}
	e.do(admin, "POST", codesPath+"/"+id+"/revoke", nil)
	if r := e.do(admin, "POST", codesPath+"/"+id+"/reset-attempts", nil); r.status != 409 || r.json(t)["code"] != "INVALID_STATE" {
		t.Fatalf("reset of a revoked code: %d %s", r.status, r.body)
	}
}

// adminActor is how the bootstrap admin (this test process, over the unix
// socket) is named in revokedBy, createdBy and events.
var adminActor = fmt.Sprintf("uid:%d", os.Getuid())
