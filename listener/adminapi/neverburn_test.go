package adminapi_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stratumjoin/stratum/agent"
	"github.com/stratumjoin/stratum/internal/cluster"
)

// wrongSecret keeps a secret's public id and changes its last symbol: a
// guess by someone who knows the id.
func wrongSecret(s string) string {
	last := s[len(s)-1]
	repl := byte('a')
	if last == 'a' || last == 'A' {
		repl = 'b'
	}
	if strings.HasPrefix(s, "dnjoin-") {
		repl = 'A'
		if last == 'A' {
			repl = 'B'
		}
	}
	return s[:len(s)-1] + string(repl)
}

// TestTokensAndKeysNeverBurn: 20 wrong guesses by real agents against a
// join token and a join key: both still join afterwards, their failed
// counts are in their listings (joinTokens list, GET /v1/join-keys/ID), the
// failed-attempt events come at 1, 2, 4, 8 and 16, and nothing is burned.
// Neither is stretched with a memory-hard KSF. Every guess comes from
// 127.0.0.1 under the default budget of unproven starts (8 per address),
// which charges join codes' starts only: none of the 40 is refused
// JOIN_RATE_LIMITED.
func TestTokensAndKeysNeverBurn(t *testing.T) {
	e := newEnv(t)
	tokens := e.apiKey("acme", []string{"compute:join-tokens:create@compute-pool/*", "compute:join-tokens:read@compute-pool/*"})
	keys := e.apiKey("acme", nil, allKeyScopes()...)

	r := e.do(bearer(tokens), "POST", createPath, createBody("idempotencyKey", "storm", "maxUses", 2))
	if r.status != 200 {
		t.Fatalf("create token: %d %s", r.status, r.body)
	}
	tok := r.json(t)
	r = e.do(bearer(keys), "POST", keysPath, keyBody("name", "storm"))
	if r.status != 200 {
		t.Fatalf("create key: %d %s", r.status, r.body)
	}
	key := r.json(t)["data"].(map[string]any)

	for _, s := range []struct {
		kind, id, secret, event string
		failed                  func() any
	}{
		{"token", tok["id"].(string), tok["token"].(string), cluster.EventTokenFailed, func() any {
			r := e.do(bearer(tokens), "POST", listPath, map[string]any{"tenantId": "acme", "poolId": "pool-a"})
			for _, it := range r.json(t)["items"].([]any) {
				if m := it.(map[string]any); m["id"] == tok["id"] {
					return m["failedAttempts"]
				}
			}
			return nil
		}},
		{"key", key["id"].(string), key["token"].(string), cluster.EventKeyFailed, func() any {
			return e.do(bearer(keys), "GET", keysPath+"/"+key["id"].(string), nil).json(t)["data"].(map[string]any)["failedAttempts"]
		}},
	} {
		t.Run(s.kind, func(t *testing.T) {
			if sec, err := e.l.Cluster().Secret(t.Context(), s.id); err != nil || !sec.KSF.None() {
				t.Fatalf("%s KSF %+v (%v), want none", s.kind, sec.KSF, err)
			}
			wrong := wrongSecret(s.secret)
			for i := range 20 {
				if _, err := e.join(wrong, machine("4c4c4544-0000-0000-0000-0000000bb0"+fmt.Sprint(10+i), "guess")); !errors.Is(err, agent.ErrNotAccepted) {
					t.Fatalf("guess %d: %v, want not accepted", i, err)
				}
			}
			// a failed start is counted after its answer, so the agent
			// may be told before the count lands
			got := s.failed()
			for deadline := time.Now().Add(10 * time.Second); got != 20.0 && time.Now().Before(deadline); got = s.failed() {
				time.Sleep(10 * time.Millisecond)
			}
			if got != 20.0 {
				t.Errorf("failedAttempts %v, want 20", got)
			}
			var at []string
			for _, ev := range e.events(s.event) {
				if ev.Fields["id"] == s.id {
					at = append(at, fmt.Sprint(ev.Fields["failedAttempts"]))
				}
			}
			if fmt.Sprint(at) != "[1 2 4 8 16]" {
				t.Errorf("%s events at %v, want [1 2 4 8 16]", s.event, at)
			}
			e.mustJoin(s.secret, machine("4c4c4544-0000-0000-0000-0000000cc0"+fmt.Sprint(10+len(s.kind)), s.kind+"-host"))
		})
	}
	if n := len(e.events(cluster.EventSecretBurned)); n != 0 {
		t.Errorf("%d burn events", n)
	}
	if r := e.do(bearer(keys), "GET", keysPath+"/"+key["id"].(string), nil).json(t)["data"].(map[string]any); r["revokedAt"] != nil {
		t.Errorf("the key was revoked: %v", r)
	}
}
