package adminapi_test

import (
	"strings"
	"testing"
)

// TestStrictMembers sends a duplicate member, a member in the wrong case
// and an unknown member to each facade: each is refused in the facade's
// own error shape, naming the member, and nothing is created.
func TestStrictMembers(t *testing.T) {
	e := newEnv(t)
	tokens := e.apiKey("acme", []string{"compute:join-tokens:create@compute-pool/*"})
	keys := e.apiKey("acme", nil, allKeyScopes()...)
	facades := []struct {
		name   string
		caller caller
		path   string
		member string // the facade's pool-like member
		base   string // the rest of a valid body
		check  func(*testing.T, response, want)
		code   string
	}{
		{"joinTokens", bearer(tokens), createPath, "poolId", `"tenantId":"acme","ttlSeconds":600,"idempotencyKey":"strict"`, checkTokenError, "INVALID_INPUT"},
		{"join keys", bearer(keys), "/v1/join-keys", "name", `"networkID":"net-a"`, func(t *testing.T, r response, w want) { checkKeyError(t, r, w) }, "ERR_INVALID_VALUE"},
		{"join codes", admin, codesPath, "pool", `"ttlSeconds":600`, checkProblem, "INVALID_INPUT"},
	}
	for _, f := range facades {
		upper := strings.ToUpper(f.member)
		valid := map[string]string{"poolId": "pool-a", "name": "strict-key", "pool": "pool-a"}[f.member]
		for _, c := range []struct {
			name, body, field string
		}{
			{"duplicate", `{` + f.base + `,"` + f.member + `":"` + valid + `","` + f.member + `":"pool-b"}`, f.member},
			{"case", `{` + f.base + `,"` + upper + `":"` + valid + `"}`, upper},
			{"unknown", `{` + f.base + `,"` + f.member + `":"` + valid + `","extra":1}`, "extra"},
		} {
			t.Run(f.name+"/"+c.name, func(t *testing.T) {
				r := e.do(f.caller, "POST", f.path, c.body)
				f.check(t, r, want{400, f.code, c.field})
			})
		}
	}
	// the bodies verbatim: joinTokens has poolId, so only extra is unknown
	// there; the other two families have no poolId member at all
	for _, f := range facades {
		for _, c := range []struct{ body, field string }{
			{`{"poolId":"a","poolId":"b"}`, "poolId"},
			{`{"POOLID":"a"}`, "POOLID"},
			{`{"poolId":"a","extra":1}`, map[bool]string{true: "extra", false: "poolId"}[f.member == "poolId"]},
		} {
			t.Run(f.name+"/verbatim "+c.body, func(t *testing.T) {
				f.check(t, e.do(f.caller, "POST", f.path, c.body), want{400, f.code, c.field})
			})
		}
	}
	// nothing was minted by any of them
	for _, typ := range []string{"security.join-token.created", "security.join-key.created", "security.join-code.created"} {
		if evs := e.events(typ); len(evs) != 0 {
			t.Errorf("%d %s events after refused requests", len(evs), typ)
		}
	}
}
