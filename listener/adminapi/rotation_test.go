package adminapi_test

import (
	"errors"
	"testing"

	"github.com/stratumjoin/stratum/agent"
	"github.com/stratumjoin/stratum/internal/cluster"
	"github.com/stratumjoin/stratum/internal/wire"
)

// TestCARotationPerKind: after `ca rotate` an old join code is listed
// revoked by system:ca-rotation (one event) and its holder is told
// JOIN_CODE_STALE, while an old token and an old key still join and their
// agents pin the new root; after `ca retire` the token and key are listed
// revoked by system:ca-retired, with events, and refused.
func TestCARotationPerKind(t *testing.T) {
	e := newEnv(t)
	tokens := e.apiKey("acme", []string{"compute:join-tokens:create@compute-pool/*", "compute:join-tokens:read@compute-pool/*"})
	keys := e.apiKey("acme", nil, allKeyScopes()...)
	code := e.do(admin, "POST", codesPath, map[string]any{"pool": "pool-a", "autoApprove": true}).json(t)
	tr := e.do(bearer(tokens), "POST", createPath, createBody("idempotencyKey", "rotate", "maxUses", 3))
	if tr.status != 200 {
		t.Fatalf("token: %d %s", tr.status, tr.body)
	}
	tok := tr.json(t)
	key := e.do(bearer(keys), "POST", keysPath, keyBody("name", "rotate")).json(t)["data"].(map[string]any)
	oldFP := code["caFingerprint"].(string)

	r := e.do(admin, "POST", "/v1/admin/cluster/ca/rotate", nil)
	if r.status != 200 {
		t.Fatalf("rotate: %d %s", r.status, r.body)
	}
	newFP := r.json(t)["caFingerprint"].(string)
	if newFP == oldFP {
		t.Fatal("rotation kept the fingerprint")
	}
	c := e.do(admin, "GET", codesPath+"/"+code["id"].(string), nil).json(t)
	if c["state"] != "revoked" || c["revokedBy"] != cluster.CARotatedBy {
		t.Fatalf("old code after rotate: state %v revokedBy %v", c["state"], c["revokedBy"])
	}
	var rotated int
	for _, ev := range e.events(cluster.EventCodeRevoked) {
		if ev.Fields["id"] == code["id"] && ev.Actor == cluster.CARotatedBy {
			rotated++
		}
	}
	if rotated != 1 {
		t.Fatalf("%d revocation events for the old code", rotated)
	}
	var refused *agent.RefusedError
	if _, err := e.join(code["code"].(string), machine("4c4c4544-0000-0000-0000-0000000dd001", "c")); !errors.As(err, &refused) || refused.Code != wire.CodeStale {
		t.Fatalf("old code after rotate: %v, want %s", err, wire.CodeStale)
	}
	for i, secret := range []string{tok["token"].(string), key["token"].(string)} {
		j := e.mustJoin(secret, machine("4c4c4544-0000-0000-0000-0000000dd01"+string(rune('0'+i)), "rot"))
		if j.Identity.CAFingerprint != newFP {
			t.Errorf("secret %d: the agent pins %s, want the new root %s", i, j.Identity.CAFingerprint, newFP)
		}
	}

	r = e.do(admin, "POST", "/v1/admin/cluster/ca/retire", nil)
	if r.status != 200 || r.json(t)["revokedSecrets"] != 2.0 {
		t.Fatalf("retire: %d %s", r.status, r.body)
	}
	lr := e.do(bearer(tokens), "POST", listPath, map[string]any{"tenantId": "acme", "poolId": "pool-a", "includeInactive": true}).json(t)
	var tokState, tokBy any
	for _, it := range lr["items"].([]any) {
		if m := it.(map[string]any); m["id"] == tok["id"] {
			tokState, tokBy = m["state"], m["revokedBy"]
		}
	}
	if tokState != "revoked" || tokBy != cluster.CARetiredBy {
		t.Errorf("token after retire: %v by %v", tokState, tokBy)
	}
	kd := e.do(bearer(keys), "GET", keysPath+"/"+key["id"].(string), nil).json(t)["data"].(map[string]any)
	if kd["revokedBy"] != cluster.CARetiredBy || kd["revokedAt"] == nil {
		t.Errorf("key after retire: %v", kd)
	}
	for typ, id := range map[string]any{cluster.EventTokenRevoked: tok["id"], cluster.EventKeyRevoked: key["id"]} {
		n := 0
		for _, ev := range e.events(typ) {
			if ev.Fields["id"] == id && ev.Actor == cluster.CARetiredBy {
				n++
			}
		}
		if n != 1 {
			t.Errorf("%d %s events for %v", n, typ, id)
		}
	}
	for i, secret := range []string{tok["token"].(string), key["token"].(string)} {
		if _, err := e.join(secret, machine("4c4c4544-0000-0000-0000-0000000dd02"+string(rune('0'+i)), "late")); !errors.As(err, &refused) || refused.Code != wire.CodeRevoked {
			t.Errorf("secret %d after retire: %v, want %s", i, err, wire.CodeRevoked)
		}
	}
}
