package adminapi_test

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stratumjoin/stratum/internal/cluster"
)

// TestNoSecretLeaks mints a secret through each facade and an API key,
// joins with each, fails joins, revokes and deletes, and then looks for
// every secret (whole, and its secret part alone) in the listener's debug
// log, the events, every list and show answer, and every value in the
// store. None may appear. It also checks that events reach the log as
// structured JSON lines.
func TestNoSecretLeaks(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	api := e.apiKey("acme", []string{"compute:join-tokens:create@*", "compute:join-tokens:read@*", "compute:join-tokens:revoke@*", "ha:DescribeJoinCodes@cluster", "ha:CreateJoinCode@cluster", "ha:RevokeJoinCode@cluster"}, allKeyScopes()...)

	tok := e.do(bearer(api), "POST", createPath, createBody("idempotencyKey", "canary", "maxUses", 3)).json(t)
	key := e.do(bearer(api), "POST", keysPath, keyBody()).json(t)["data"].(map[string]any)
	code := e.do(bearer(api), "POST", codesPath, map[string]any{"pool": "pool-a", "maxUses": 3, "autoApprove": true}).json(t)
	token, keyToken, joinCode := tok["token"].(string), key["token"].(string), code["code"].(string)

	e.mustJoin(token, machine("4c4c4544-0000-0000-0000-0000000dd001", "canary-1"))
	e.mustJoin(keyToken, machine("4c4c4544-0000-0000-0000-0000000dd002", "canary-2"))
	e.mustJoin(joinCode, machine("4c4c4544-0000-0000-0000-0000000dd003", "canary-3"))
	// a wrong secret for each locator: the listener sees the exchange fail
	var errs []string
	for _, wrong := range []string{token[:len(token)-4] + "0000", keyToken[:len(keyToken)-4] + "AAAA"} {
		_, err := e.join(wrong, machine("4c4c4544-0000-0000-0000-0000000dd004", "wrong"))
		if err == nil {
			t.Fatal("a wrong secret joined")
		}
		errs = append(errs, err.Error())
	}
	// refusals after a proven exchange name their reason, never the secret
	_, err := e.join(token, machine("4c4c4544-0000-0000-0000-0000000dd001", "canary-1"))
	if err == nil {
		t.Fatal("the same machine joined twice")
	}
	errs = append(errs, err.Error())
	for _, r := range []response{
		e.do(bearer(api), "POST", createPath, createBody("idempotencyKey", "canary", "poolId", "pool-k8s")),
		e.do(bearer(api), "POST", keysPath, keyBody()),
		e.do(bearer(api), "GET", codesPath+"/jc-none", nil),
	} {
		if r.status < 400 {
			t.Fatalf("expected an error, got %d", r.status)
		}
		errs = append(errs, string(r.body))
	}
	// a retry answers without the secret
	if r := e.do(bearer(api), "POST", createPath, createBody("idempotencyKey", "canary", "maxUses", 3)); strings.Contains(string(r.body), token) {
		t.Fatal("a retry shows the token")
	}

	var answers []string
	get := func(c caller, method, path string, body any) {
		r := e.do(c, method, path, body)
		if r.status >= 300 {
			t.Fatalf("%s %s: %d %s", method, path, r.status, r.body)
		}
		answers = append(answers, string(r.body))
	}
	get(bearer(api), "POST", listPath, map[string]any{"tenantId": "acme", "poolId": "pool-a", "includeInactive": true})
	get(bearer(api), "GET", keysPath, nil)
	get(bearer(api), "GET", keysPath+"/"+key["id"].(string), nil)
	get(bearer(api), "GET", codesPath, nil)
	get(bearer(api), "GET", codesPath+"/"+code["id"].(string), nil)
	get(admin, "GET", "/v1/admin/cluster/nodes", nil)
	get(admin, "GET", "/v1/admin/cluster/joins", nil)
	get(admin, "GET", "/v1/admin/api-keys", nil)
	get(bearer(api), "POST", revokePath, map[string]any{"tenantId": "acme", "poolId": "pool-a", "tokenId": tok["id"]})
	get(bearer(api), "POST", codesPath+"/"+code["id"].(string)+"/revoke", nil)
	get(bearer(api), "DELETE", keysPath+"/"+key["id"].(string), nil)
	get(admin, "GET", "/v1/admin/cluster/events", nil)

	evs, err := e.l.Cluster().Events(ctx, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	evJSON, _ := json.Marshal(evs)
	kvs, err := e.l.Store().List(ctx, "", "", 0)
	if err != nil {
		t.Fatal(err)
	}
	var stored strings.Builder
	for _, kv := range kvs {
		stored.WriteString(kv.Key + "=" + string(kv.Value) + "\n")
	}
	logs := e.logs.String()
	// every committed transaction is on disk (bbolt syncs each commit)
	dbFile, err := os.ReadFile(filepath.Join(e.l.DataDir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}

	secretPart := func(s, sep string) string { return s[strings.LastIndex(s, sep)+1:] }
	canaries := map[string]string{
		"join token":          token,
		"join token secret":   secretPart(token, "."),
		"join key":            keyToken,
		"join key secret":     secretPart(keyToken, "-"),
		"join code":           joinCode,
		"join code unhyphend": strings.ReplaceAll(joinCode, "-", ""),
		"api key":             api,
		"api key secret":      secretPart(api, "_"),
	}
	places := map[string]string{
		"log": logs, "events": string(evJSON), "store": stored.String(), "store file": string(dbFile),
		"answers": strings.Join(answers, "\n"), "errors": strings.Join(errs, "\n"),
	}
	for what, secret := range canaries {
		for where, text := range places {
			if strings.Contains(strings.ToLower(text), strings.ToLower(secret)) {
				t.Errorf("the %s appears in the %s", what, where)
			}
		}
	}

	// events are logged as structured JSON lines, each once
	logged := map[string]int{}
	sc := bufio.NewScanner(strings.NewReader(logs))
	for sc.Scan() {
		var line map[string]any
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatalf("a log line is not JSON: %q", sc.Text())
		}
		if seq, ok := line["seq"].(string); ok && line["msg"] == "event" {
			logged[seq]++
		}
	}
	for _, ev := range evs {
		if logged[ev.Seq] != 1 {
			t.Errorf("event %s %s logged %d times", ev.Seq, ev.Type, logged[ev.Seq])
		}
	}
	for _, typ := range []string{cluster.EventTokenCreated, cluster.EventTokenRevoked, cluster.EventKeyCreated, cluster.EventKeyDeleted, cluster.EventCodeCreated, cluster.EventCodeRevoked, cluster.EventNodeJoined, cluster.EventAPIKeyCreated} {
		if len(e.events(typ)) == 0 {
			t.Errorf("no %s event", typ)
		}
	}
	// events are in order
	for i := 1; i < len(evs); i++ {
		if evs[i].Seq <= evs[i-1].Seq || evs[i].Time.Before(evs[i-1].Time) {
			t.Errorf("events out of order at %d", i)
		}
	}
}
