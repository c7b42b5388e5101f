package adminapi_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stratumjoin/stratum/agent"
	"github.com/stratumjoin/stratum/internal/cluster"
	"github.com/stratumjoin/stratum/internal/wire"
)

const keysPath = "/v1/join-keys"

var keyIDRE = regexp.MustCompile(`^dnjoin-[A-Z2-7]{26}$`)

func keyBody(changes ...any) map[string]any {
	return body(map[string]any{"name": "ci-runner", "networkID": "net-a"}, changes...)
}

func allKeyScopes() []string {
	return []string{"join-keys:create", "join-keys:list", "join-keys:read", "join-keys:delete"}
}

// TestJoinKeysSeed003 walks every constraint and error of the join-keys API,
// checking status, the {"errors":[...]} shape, code and path.
func TestJoinKeysSeed003(t *testing.T) {
	e := newEnv(t)
	key := e.apiKey("acme", nil, allKeyScopes()...)
	globex := e.apiKey("globex", nil, allKeyScopes()...)
	readOnly := e.apiKey("acme", nil, "join-keys:read")
	tokensOnly := e.apiKey("acme", []string{"compute:join-tokens:create@*"})
	revoked := e.apiKey("acme", nil, allKeyScopes()...)
	if _, err := e.l.Admin.RevokeAPIKey(context.Background(), apiKeyID(revoked)); err != nil {
		t.Fatal(err)
	}
	expiring, err := e.l.Admin.CreateAPIKey(context.Background(), apiKeyRequest("acme", allKeyScopes(), time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	r := e.do(bearer(key), "POST", keysPath, keyBody("name", "taken"))
	if r.status != 200 {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	globexKey := e.do(bearer(globex), "POST", keysPath, keyBody("networkID", "net-g", "name", "g")).json(t)["data"].(map[string]any)["id"].(string)
	future := time.Now().Add(24 * time.Hour).UTC().Format(time.RFC3339)
	tags := make([]string, 65)
	for i := range tags {
		tags[i] = fmt.Sprintf("t%d", i)
	}

	cases := []struct {
		name   string
		caller caller
		method string
		path   string
		body   any
		want   want
		header []string
	}{
		{name: "create ok", caller: bearer(key), body: keyBody("name", "ok-1", "roleID", "role-ci", "tags", []string{"env:ci"}, "autoAssignCIDRs", []string{"100.100.0.0/22"}, "expiresAt", future), want: want{status: 200}},
		{name: "name missing", caller: bearer(key), body: keyBody("name", nil), want: want{400, "ERR_MISSING_VALUE", "name"}},
		{name: "name empty", caller: bearer(key), body: keyBody("name", ""), want: want{400, "ERR_MISSING_VALUE", "name"}},
		{name: "name 55 characters", caller: bearer(key), body: keyBody("name", strings.Repeat("a", 55)), want: want{400, "ERR_INVALID_VALUE", "name"}},
		{name: "name 54 characters", caller: bearer(key), body: keyBody("name", strings.Repeat("a", 54)), want: want{status: 200}},
		{name: "name uppercase", caller: bearer(key), body: keyBody("name", "CI"), want: want{400, "ERR_INVALID_VALUE", "name"}},
		{name: "name leading hyphen", caller: bearer(key), body: keyBody("name", "-ci"), want: want{400, "ERR_INVALID_VALUE", "name"}},
		{name: "name trailing hyphen", caller: bearer(key), body: keyBody("name", "ci-"), want: want{400, "ERR_INVALID_VALUE", "name"}},
		{name: "name underscore", caller: bearer(key), body: keyBody("name", "ci_runner"), want: want{400, "ERR_INVALID_VALUE", "name"}},
		{name: "name taken", caller: bearer(key), body: keyBody("name", "taken"), want: want{400, "ERR_DUPLICATE_VALUE", "name"}},
		{name: "name taken in another organization", caller: bearer(globex), body: keyBody("name", "taken", "networkID", "net-g"), want: want{status: 200}},
		{name: "networkID missing", caller: bearer(key), body: keyBody("networkID", nil), want: want{400, "ERR_MISSING_VALUE", "networkID"}},
		{name: "networkID unknown", caller: bearer(key), body: keyBody("networkID", "network-NOPE"), want: want{400, "ERR_INVALID_REFERENCE", "networkID"}},
		{name: "networkID of another organization", caller: bearer(key), body: keyBody("networkID", "net-g"), want: want{400, "ERR_INVALID_REFERENCE", "networkID"}},
		{name: "roleID unknown", caller: bearer(key), body: keyBody("roleID", "role-NOPE"), want: want{400, "ERR_INVALID_REFERENCE", "roleID"}},
		{name: "roleID of another organization", caller: bearer(key), body: keyBody("roleID", "role-g"), want: want{400, "ERR_INVALID_REFERENCE", "roleID"}},
		{name: "roleID null", caller: bearer(key), body: `{"name":"no-role","networkID":"net-a","roleID":null,"tags":null,"autoAssignCIDRs":null,"expiresAt":null}`, want: want{status: 200}},
		{name: "tags empty string", caller: bearer(key), body: keyBody("tags", []string{"ok", ""}), want: want{400, "ERR_INVALID_VALUE", "tags[1]"}},
		{name: "tags too many", caller: bearer(key), body: keyBody("tags", tags), want: want{400, "ERR_INVALID_VALUE", "tags"}},
		{name: "tags not an array", caller: bearer(key), body: keyBody("tags", "env:ci"), want: want{400, "ERR_INVALID_VALUE", "tags"}},
		{name: "autoAssignCIDRs three", caller: bearer(key), body: keyBody("autoAssignCIDRs", []string{"100.100.0.0/22", "fdef:c0:c0:1::/80", "10.0.0.0/8"}), want: want{400, "ERR_INVALID_VALUE", "autoAssignCIDRs"}},
		{name: "autoAssignCIDRs not the network's", caller: bearer(key), body: keyBody("autoAssignCIDRs", []string{"100.100.4.0/22"}), want: want{400, "ERR_INVALID_VALUE", "autoAssignCIDRs[0]"}},
		{name: "autoAssignCIDRs inside the network", caller: bearer(key), body: keyBody("autoAssignCIDRs", []string{"100.100.0.0/24"}), want: want{400, "ERR_INVALID_VALUE", "autoAssignCIDRs[0]"}},
		{name: "autoAssignCIDRs not canonical", caller: bearer(key), body: keyBody("autoAssignCIDRs", []string{"100.100.0.1/22"}), want: want{400, "ERR_INVALID_VALUE", "autoAssignCIDRs[0]"}},
		{name: "autoAssignCIDRs twice", caller: bearer(key), body: keyBody("autoAssignCIDRs", []string{"100.100.0.0/22", "100.100.0.0/22"}), want: want{400, "ERR_INVALID_VALUE", "autoAssignCIDRs[1]"}},
		{name: "autoAssignCIDRs both", caller: bearer(key), body: keyBody("name", "both", "autoAssignCIDRs", []string{"fdef:c0:c0:1::/80", "100.100.0.0/22"}), want: want{status: 200}},
		{name: "expiresAt past", caller: bearer(key), body: keyBody("expiresAt", "2020-01-01T00:00:00Z"), want: want{400, "ERR_INVALID_VALUE", "expiresAt"}},
		{name: "expiresAt not a date-time", caller: bearer(key), body: keyBody("expiresAt", "tomorrow"), want: want{400, "ERR_INVALID_VALUE", "expiresAt"}},
		{name: "unknown field", caller: bearer(key), body: keyBody("organizationID", "acme"), want: want{400, "ERR_INVALID_VALUE", "organizationID"}},
		{name: "not JSON", caller: bearer(key), body: `name=x`, want: want{400, "ERR_INVALID_VALUE", ""}},
		{name: "trailing data", caller: bearer(key), body: `{"name":"x","networkID":"net-a"}x`, want: want{400, "ERR_INVALID_VALUE", ""}},
		{name: "no api key", caller: anonymous, body: keyBody(), want: want{401, "ERR_UNAUTHORIZED", ""}},
		{name: "invalid api key", caller: bearer("sjk_0000000000000000_" + strings.Repeat("1", 52)), body: keyBody(), want: want{401, "ERR_UNAUTHORIZED", ""}},
		{name: "revoked api key", caller: bearer(revoked), body: keyBody(), want: want{401, "ERR_UNAUTHORIZED", ""}},
		{name: "api key without the scope", caller: bearer(readOnly), body: keyBody(), want: want{403, "ERR_FORBIDDEN", ""}},
		{name: "api key with grants only", caller: bearer(tokensOnly), body: keyBody(), want: want{403, "ERR_FORBIDDEN", ""}},
		{name: "from a browser", caller: bearer(key), body: keyBody(), header: []string{"Origin", "https://evil.example"}, want: want{403, "ERR_FORBIDDEN", ""}},

		{name: "list ok", caller: bearer(key), method: "GET", path: keysPath, want: want{status: 200}},
		{name: "list pageSize 0", caller: bearer(key), method: "GET", path: keysPath + "?pageSize=0", want: want{400, "ERR_INVALID_VALUE", "pageSize"}},
		{name: "list pageSize 501", caller: bearer(key), method: "GET", path: keysPath + "?pageSize=501", want: want{400, "ERR_INVALID_VALUE", "pageSize"}},
		{name: "list bad cursor", caller: bearer(key), method: "GET", path: keysPath + "?cursor=x", want: want{400, "ERR_INVALID_VALUE", "cursor"}},
		{name: "list unknown parameter", caller: bearer(key), method: "GET", path: keysPath + "?filter=x", want: want{400, "ERR_INVALID_VALUE", "filter"}},
		{name: "list without scope", caller: bearer(readOnly), method: "GET", path: keysPath, want: want{403, "ERR_FORBIDDEN", ""}},
		{name: "get unknown", caller: bearer(key), method: "GET", path: keysPath + "/dnjoin-AAAAAAAAAAAAAAAAAAAAAAAAAA", want: want{404, "ERR_NOT_FOUND", ""}},
		{name: "get another organization's", caller: bearer(key), method: "GET", path: keysPath + "/" + globexKey, want: want{404, "ERR_NOT_FOUND", ""}},
		{name: "delete another organization's", caller: bearer(key), method: "DELETE", path: keysPath + "/" + globexKey, want: want{404, "ERR_NOT_FOUND", ""}},
		{name: "delete without scope", caller: bearer(readOnly), method: "DELETE", path: keysPath + "/" + globexKey, want: want{403, "ERR_FORBIDDEN", ""}},
		{name: "get no api key", caller: anonymous, method: "GET", path: keysPath + "/" + globexKey, want: want{401, "ERR_UNAUTHORIZED", ""}},
		{name: "PUT", caller: bearer(key), method: "PUT", path: keysPath, body: keyBody(), want: want{405, "ERR_METHOD_NOT_ALLOWED", ""}},
		{name: "expired api key", caller: bearer(expiring.Key), body: keyBody(), want: want{401, "ERR_UNAUTHORIZED", ""}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.name == "expired api key" {
				e.clock.advance(2 * time.Minute)
			}
			method, path := c.method, c.path
			if method == "" {
				method, path = "POST", keysPath
			}
			r := e.do(c.caller, method, path, c.body, c.header...)
			if c.want.status == 200 {
				if r.status != 200 {
					t.Fatalf("status %d: %s", r.status, r.body)
				}
				return
			}
			entries := checkKeyError(t, r, c.want)
			switch c.want.code {
			case "ERR_UNAUTHORIZED":
				if entries[0]["message"] != "unauthorized" {
					t.Errorf("message %v", entries[0]["message"])
				}
			case "ERR_FORBIDDEN":
				if c.header == nil && !strings.HasPrefix(entries[0]["message"].(string), "api key must support the following scopes: join-keys:") {
					t.Errorf("message %v does not name the scope", entries[0]["message"])
				}
			case "ERR_DUPLICATE_VALUE":
				if entries[0]["message"] != "value already exists" {
					t.Errorf("message %v", entries[0]["message"])
				}
			}
		})
	}
}

// TestJoinKeyLimitAndRate: the organization's join key limit answers
// ERR_LIMIT_EXCEEDED with extra.limit and extra.limitName, and its request
// rate ERR_TOO_MANY_REQUESTS.
func TestJoinKeyLimitAndRate(t *testing.T) {
	e := newEnv(t)
	key := e.apiKey("small", nil, allKeyScopes()...) // small may hold 3 keys
	var ids []string
	for i := range 3 {
		r := e.do(bearer(key), "POST", keysPath, keyBody("name", fmt.Sprintf("k%d", i), "networkID", "net-s"))
		if r.status != 200 {
			t.Fatalf("create %d: %d %s", i, r.status, r.body)
		}
		ids = append(ids, r.json(t)["data"].(map[string]any)["id"].(string))
	}
	entries := checkKeyError(t, e.do(bearer(key), "POST", keysPath, keyBody("name", "k3", "networkID", "net-s")), want{400, "ERR_LIMIT_EXCEEDED", ""})
	extra, _ := entries[0]["extra"].(map[string]any)
	if extra["limit"] != 3.0 || extra["limitName"] != "joinKeys" {
		t.Errorf("extra %v", extra)
	}
	// deleting one makes room
	if r := e.do(bearer(key), "DELETE", keysPath+"/"+ids[0], nil); r.status != 200 {
		t.Fatalf("delete: %d %s", r.status, r.body)
	}
	if r := e.do(bearer(key), "POST", keysPath, keyBody("name", "k0", "networkID", "net-s")); r.status != 200 {
		t.Fatalf("create after delete, with the deleted key's name: %d %s", r.status, r.body)
	}
	checkKeyError(t, e.do(bearer(key), "POST", keysPath, keyBody("name", "k4", "networkID", "net-s")), want{400, "ERR_LIMIT_EXCEEDED", ""})

	// tenant "throttled": burst 2, then almost nothing
	slow := e.apiKey("throttled", nil, allKeyScopes()...)
	for i := range 2 {
		if r := e.do(bearer(slow), "GET", keysPath, nil); r.status != 200 {
			t.Fatalf("request %d: %d %s", i, r.status, r.body)
		}
	}
	throttled := e.do(bearer(slow), "GET", keysPath, nil)
	entries = checkKeyError(t, throttled, want{429, "ERR_TOO_MANY_REQUESTS", ""})
	if ra, err := strconv.Atoi(throttled.header.Get("Retry-After")); err != nil || ra < 1 {
		t.Errorf("Retry-After %q, want whole seconds >= 1", throttled.header.Get("Retry-After"))
	}
	if entries[0]["message"] != "too many requests" {
		t.Errorf("message %v", entries[0]["message"])
	}
	// the limit is the organization's, not the key's
	other := e.apiKey("throttled", nil, allKeyScopes()...)
	checkKeyError(t, e.do(bearer(other), "POST", keysPath, keyBody("networkID", "net-t")), want{429, "ERR_TOO_MANY_REQUESTS", ""})
	// and other organizations are not affected
	if r := e.do(bearer(key), "GET", keysPath, nil); r.status != 200 {
		t.Fatalf("another organization throttled too: %d", r.status)
	}
}

// TestJoinKeyLifecycle creates, reads, lists and deletes a join key; hosts
// that enroll with it get its network, role, tags, distinct addresses
// from its prefixes and their hostname (or the key's name and a suffix);
// after delete the key is refused.
func TestJoinKeyLifecycle(t *testing.T) {
	e := newEnv(t)
	key := e.apiKey("acme", nil, allKeyScopes()...)
	exp := time.Now().Add(48 * time.Hour).UTC().Truncate(time.Second)
	r := e.do(bearer(key), "POST", keysPath, keyBody("roleID", "role-ci", "tags", []string{"env:ci", "team:infra"}, "autoAssignCIDRs", []string{"100.100.0.0/22"}, "expiresAt", exp.Format(time.RFC3339)))
	if r.status != 200 {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	data := r.json(t)["data"].(map[string]any)
	for _, f := range []string{"id", "organizationID", "name", "networkID", "roleID", "tags", "autoAssignCIDRs", "expiresAt", "createdAt", "modifiedAt", "token"} {
		if _, ok := data[f]; !ok {
			t.Errorf("response lacks %s", f)
		}
	}
	id, token := data["id"].(string), data["token"].(string)
	if !keyIDRE.MatchString(id) || !strings.HasPrefix(token, id+"-") || len(token) < len(id)+1+52 {
		t.Fatalf("id %q token shape %d", id, len(token))
	}
	if data["organizationID"] != "acme" || data["roleID"] != "role-ci" || fmt.Sprint(data["autoAssignCIDRs"]) != "[100.100.0.0/22 fdef:c0:c0:1::/80]" || data["expiresAt"] != exp.Format(time.RFC3339) {
		t.Errorf("data %v", data)
	}

	get := e.do(bearer(key), "GET", keysPath+"/"+id, nil)
	if get.status != 200 || strings.Contains(string(get.body), "token") {
		t.Fatalf("get: %d %s", get.status, get.body)
	}
	list := e.do(bearer(key), "GET", keysPath, nil)
	if list.status != 200 || !strings.Contains(string(list.body), id) || strings.Contains(string(list.body), `"token"`) {
		t.Fatalf("list: %d %s", list.status, list.body)
	}

	// the network's IPv6 prefix is always there; a network without one and
	// no prefixes asked gives none
	v6 := e.do(bearer(key), "POST", keysPath, keyBody("name", "v6-only")).json(t)["data"].(map[string]any)
	if fmt.Sprint(v6["autoAssignCIDRs"]) != "[fdef:c0:c0:1::/80]" || v6["roleID"] != nil || fmt.Sprint(v6["tags"]) != "[]" || v6["expiresAt"] != nil {
		t.Errorf("defaults %v", v6)
	}
	bare := e.do(bearer(key), "POST", keysPath, keyBody("name", "bare", "networkID", "net-tiny")).json(t)["data"].(map[string]any)
	if v, ok := bare["autoAssignCIDRs"]; !ok || v != nil {
		t.Errorf("autoAssignCIDRs %v (present %v), want null", v, ok)
	}

	h1 := e.mustJoin(token, machine("4c4c4544-0000-0000-0000-00000000aa01", "web-1.example.com"))
	h2 := e.mustJoin(token, machine("4c4c4544-0000-0000-0000-00000000aa02", "localhost"))
	h3 := e.mustJoin(v6["token"].(string), machine("4c4c4544-0000-0000-0000-00000000aa03", "web-3"))
	for _, h := range []*agent.Joined{h1, h2, h3} {
		if h.Identity.Host == nil || h.Identity.Host.NetworkID != "net-a" || h.Identity.Trust != cluster.TrustTenantOwned {
			t.Fatalf("host %+v", h.Identity)
		}
	}
	if h1.Identity.Host.Name != "web-1" || !regexp.MustCompile(`^ci-runner-[0-9a-f]+$`).MatchString(h2.Identity.Host.Name) {
		t.Errorf("names %q %q", h1.Identity.Host.Name, h2.Identity.Host.Name)
	}
	if h1.Identity.Host.RoleID != "role-ci" || fmt.Sprint(h1.Identity.Host.Tags) != "[env:ci team:infra]" {
		t.Errorf("host role/tags %+v", h1.Identity.Host)
	}
	if fmt.Sprint(h1.Identity.Host.Addresses) != "[100.100.0.1/22 fdef:c0:c0:1::1/80]" || fmt.Sprint(h2.Identity.Host.Addresses) != "[100.100.0.2/22 fdef:c0:c0:1::2/80]" {
		t.Errorf("addresses %v %v", h1.Identity.Host.Addresses, h2.Identity.Host.Addresses)
	}
	// another key of the same network never hands out a taken address
	if fmt.Sprint(h3.Identity.Host.Addresses) != "[fdef:c0:c0:1::3/80]" {
		t.Errorf("second key's host got %v", h3.Identity.Host.Addresses)
	}

	del := e.do(bearer(key), "DELETE", keysPath+"/"+id, nil)
	if del.status != 200 || strings.TrimSpace(string(del.body)) != "{\n  \"data\": {}\n}" {
		t.Fatalf("delete: %d %s", del.status, del.body)
	}
	checkKeyError(t, e.do(bearer(key), "GET", keysPath+"/"+id, nil), want{404, "ERR_NOT_FOUND", ""})
	checkKeyError(t, e.do(bearer(key), "DELETE", keysPath+"/"+id, nil), want{404, "ERR_NOT_FOUND", ""})
	if _, err := e.join(token, machine("4c4c4544-0000-0000-0000-00000000aa04", "web-4")); !errors.Is(err, agent.ErrNotAccepted) {
		t.Fatalf("join with a deleted key: %v", err)
	}
	if n := len(e.events(cluster.EventKeyCreated)); n != 3 {
		t.Errorf("%d created events", n)
	}
	if evs := e.events(cluster.EventKeyDeleted); len(evs) != 1 || evs[0].Fields["id"] != id {
		t.Errorf("deleted events %+v", evs)
	}

	// an expired key stops enrolling
	short := e.do(bearer(key), "POST", keysPath, keyBody("name", "short", "expiresAt", time.Now().Add(time.Minute).UTC().Format(time.RFC3339))).json(t)["data"].(map[string]any)
	e.clock.advance(2 * time.Minute)
	_, err := e.join(short["token"].(string), machine("4c4c4544-0000-0000-0000-00000000aa05", "late"))
	var refused *agent.RefusedError
	if !errors.As(err, &refused) || refused.Code != wire.CodeExpired {
		t.Fatalf("join with an expired key: %v", err)
	}
}

// TestJoinKeyAddressesRunOut: a /30 has two host addresses; the third host
// is refused rather than given a duplicate.
func TestJoinKeyAddressesRunOut(t *testing.T) {
	e := newEnv(t)
	key := e.apiKey("acme", nil, allKeyScopes()...)
	tok := e.do(bearer(key), "POST", keysPath, keyBody("networkID", "net-tiny", "autoAssignCIDRs", []string{"10.9.0.0/30"})).json(t)["data"].(map[string]any)["token"].(string)
	a := e.mustJoin(tok, machine("4c4c4544-0000-0000-0000-00000000bb01", "a"))
	b := e.mustJoin(tok, machine("4c4c4544-0000-0000-0000-00000000bb02", "b"))
	if fmt.Sprint(a.Identity.Host.Addresses, b.Identity.Host.Addresses) != "[10.9.0.1/30] [10.9.0.2/30]" {
		t.Errorf("addresses %v %v", a.Identity.Host.Addresses, b.Identity.Host.Addresses)
	}
	_, err := e.join(tok, machine("4c4c4544-0000-0000-0000-00000000bb03", "c"))
	var refused *agent.RefusedError
	if !errors.As(err, &refused) || refused.Code != wire.CodeAddressExhausted {
		t.Fatalf("third host: %v", err)
	}
}

// TestJoinKeyPages lists an organization's keys a page at a time.
func TestJoinKeyPages(t *testing.T) {
	e := newEnv(t)
	key := e.apiKey("globex", nil, allKeyScopes()...)
	want := map[string]bool{}
	for i := range 5 {
		r := e.do(bearer(key), "POST", keysPath, keyBody("name", fmt.Sprintf("p%d", i), "networkID", "net-g"))
		want[r.json(t)["data"].(map[string]any)["id"].(string)] = true
	}
	got := map[string]bool{}
	path := keysPath + "?pageSize=2"
	for range 5 {
		var page struct {
			Data     []struct{ ID string }
			Metadata struct {
				HasNextPage bool
				NextCursor  string
			}
		}
		e.do(bearer(key), "GET", path, nil).decode(t, &page)
		if len(page.Data) > 2 {
			t.Fatalf("page of %d", len(page.Data))
		}
		for _, d := range page.Data {
			got[d.ID] = true
		}
		if !page.Metadata.HasNextPage {
			break
		}
		path = keysPath + "?pageSize=2&cursor=" + page.Metadata.NextCursor
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("pages gave %v, want %v", got, want)
	}
}

// TestJoinKeyRaces: concurrent creates never pass the organization's
// limit, and one name is taken once.
func TestJoinKeyRaces(t *testing.T) {
	e := newEnv(t)
	key := e.apiKey("small", nil, allKeyScopes()...) // small may hold 3 keys
	const n = 8
	statuses := make([]response, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			statuses[i] = e.do(bearer(key), "POST", keysPath, keyBody("name", fmt.Sprintf("race-%d", i), "networkID", "net-s"))
		}()
	}
	wg.Wait()
	ok := 0
	for _, r := range statuses {
		switch r.status {
		case 200:
			ok++
		default:
			checkKeyError(t, r, want{400, "ERR_LIMIT_EXCEEDED", ""})
		}
	}
	if ok != 3 {
		t.Fatalf("%d creates succeeded, want the limit of 3", ok)
	}

	other := e.apiKey("acme", nil, allKeyScopes()...)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			statuses[i] = e.do(bearer(other), "POST", keysPath, keyBody("name", "same-name"))
		}()
	}
	wg.Wait()
	ok = 0
	for _, r := range statuses {
		if r.status == 200 {
			ok++
			continue
		}
		checkKeyError(t, r, want{400, "ERR_DUPLICATE_VALUE", "name"})
	}
	if ok != 1 {
		t.Fatalf("%d creates of one name succeeded", ok)
	}
}
