package adminapi_test

import (
	"fmt"
	"strings"
	"testing"
)

// TestJoinCodeDescriptionAndLabels: a code minted with a description and
// labels keeps them, in the mint answer, the list and the code's own
// route; `label=K=V` filters the list; bad ones are refused at their
// field path.
func TestJoinCodeDescriptionAndLabels(t *testing.T) {
	e := newEnv(t)
	mint := func(b map[string]any) map[string]any {
		t.Helper()
		r := e.do(admin, "POST", codesPath, b)
		if r.status != 201 {
			t.Fatalf("mint: %d %s", r.status, r.body)
		}
		return r.json(t)
	}
	rack := mint(map[string]any{"pool": "pool-a", "description": "rack 12, batch of March", "labels": map[string]string{"rack": "r12", "team/owner": "infra"}})
	other := mint(map[string]any{"pool": "pool-a", "labels": map[string]string{"rack": "r13"}})
	plain := mint(map[string]any{"pool": "pool-a"})
	if rack["description"] != "rack 12, batch of March" || fmt.Sprint(rack["labels"]) != "map[rack:r12 team/owner:infra]" {
		t.Errorf("mint answer: %v %v", rack["description"], rack["labels"])
	}
	if _, ok := plain["labels"]; ok {
		t.Errorf("a code without labels lists labels: %v", plain["labels"])
	}
	if _, ok := plain["description"]; ok {
		t.Errorf("a code without a description lists one: %v", plain["description"])
	}
	got := e.do(admin, "GET", codesPath+"/"+rack["id"].(string), nil).json(t)
	if got["description"] != rack["description"] || fmt.Sprint(got["labels"]) != fmt.Sprint(rack["labels"]) {
		t.Errorf("get: %v %v", got["description"], got["labels"])
	}
	ids := func(query string) string {
		t.Helper()
		r := e.do(admin, "GET", codesPath+query, nil)
		if r.status != 200 {
			t.Fatalf("list %s: %d %s", query, r.status, r.body)
		}
		var out []string
		for _, it := range r.json(t)["items"].([]any) {
			out = append(out, it.(map[string]any)["id"].(string))
		}
		return strings.Join(out, ",")
	}
	if got, want := ids(""), plain["id"].(string)+","+other["id"].(string)+","+rack["id"].(string); got != want {
		t.Errorf("list: %s, want %s", got, want)
	}
	if got := ids("?label=rack=r12"); got != rack["id"] {
		t.Errorf("label=rack=r12: %s", got)
	}
	if got := ids("?label=rack=r12&label=team/owner=infra"); got != rack["id"] {
		t.Errorf("two labels: %s", got)
	}
	if got := ids("?label=rack=r12&label=team/owner=web"); got != "" {
		t.Errorf("a label that does not match: %s", got)
	}
	checkProblem(t, e.do(admin, "GET", codesPath+"?label=rack", nil), want{400, "INVALID_INPUT", "label"})

	many := map[string]string{}
	for i := range 17 {
		many[fmt.Sprintf("k%d", i)] = "v"
	}
	for name, c := range map[string]struct {
		body  map[string]any
		field string
	}{
		"description too long":   {map[string]any{"description": strings.Repeat("é", 257)}, "description"},
		"description with a tab": {map[string]any{"description": "a\tb"}, "description"},
		"17 labels":              {map[string]any{"labels": many}, "labels"},
		"key with uppercase":     {map[string]any{"labels": map[string]string{"Rack": "r1"}}, "labels.Rack"},
		"empty value":            {map[string]any{"labels": map[string]string{"rack": ""}}, "labels.rack"},
		"value with a space":     {map[string]any{"labels": map[string]string{"rack": "r 1"}}, "labels.rack"},
		"key longer than 63":     {map[string]any{"labels": map[string]string{strings.Repeat("k", 64): "v"}}, "labels"},
		"labels not an object":   {map[string]any{"labels": []string{"rack=r1"}}, "labels"},
	} {
		t.Run(name, func(t *testing.T) {
			checkProblem(t, e.do(admin, "POST", codesPath, c.body), want{400, "INVALID_INPUT", c.field})
		})
	}
	// 256 characters, however many bytes, is allowed
	mint(map[string]any{"pool": "pool-a", "description": strings.Repeat("é", 256)})
}
