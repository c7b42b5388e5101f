package adminapi_test

import (
	"slices"
	"strings"
	"testing"
)

// want is the error a table case expects: the HTTP status, the facade's
// code and, where the seed points at a field, that field.
type want struct {
	status int
	code   string
	field  string
}

func keysOf(m map[string]any) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// checkTokenError checks the joinTokens API's error shape:
// {"error":{"code","message","requestId","details":[{"field","message"}]}}.
func checkTokenError(t *testing.T, r response, w want) {
	t.Helper()
	if r.status != w.status {
		t.Fatalf("status %d, want %d\n%s", r.status, w.status, r.body)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q", ct)
	}
	body := r.json(t)
	if ks := keysOf(body); !slices.Equal(ks, []string{"error"}) {
		t.Fatalf("top-level keys %v, want [error]\n%s", ks, r.body)
	}
	e, ok := body["error"].(map[string]any)
	if !ok {
		t.Fatalf("error is not an object: %s", r.body)
	}
	if e["code"] != w.code {
		t.Errorf("code %v, want %s\n%s", e["code"], w.code, r.body)
	}
	if msg, _ := e["message"].(string); msg == "" {
		t.Errorf("no message: %s", r.body)
	}
	if e["requestId"] != r.header.Get("X-Request-Id") || r.header.Get("X-Request-Id") == "" {
		t.Errorf("requestId %v, header %q", e["requestId"], r.header.Get("X-Request-Id"))
	}
	for _, k := range keysOf(e) {
		if !slices.Contains([]string{"code", "message", "requestId", "details"}, k) {
			t.Errorf("unexpected key %q in error", k)
		}
	}
	if w.field == "" {
		return
	}
	details, _ := e["details"].([]any)
	for _, d := range details {
		dm := d.(map[string]any)
		if dm["field"] == w.field {
			if m, _ := dm["message"].(string); m == "" {
				t.Errorf("detail for %s has no message", w.field)
			}
			return
		}
	}
	t.Errorf("no detail for field %q: %s", w.field, r.body)
}

// checkKeyError checks the join-keys API's error shape:
// {"errors":[{"code","message","path"?,"param"?,"extra"?}]}; field, when
// set, must be the path (or param) of an entry with the code.
func checkKeyError(t *testing.T, r response, w want) []map[string]any {
	t.Helper()
	if r.status != w.status {
		t.Fatalf("status %d, want %d\n%s", r.status, w.status, r.body)
	}
	body := r.json(t)
	if ks := keysOf(body); !slices.Equal(ks, []string{"errors"}) {
		t.Fatalf("top-level keys %v, want [errors]\n%s", ks, r.body)
	}
	list, _ := body["errors"].([]any)
	if len(list) == 0 {
		t.Fatalf("no errors: %s", r.body)
	}
	var entries []map[string]any
	found := false
	for _, it := range list {
		e := it.(map[string]any)
		entries = append(entries, e)
		for _, k := range keysOf(e) {
			if !slices.Contains([]string{"code", "message", "path", "param", "extra"}, k) {
				t.Errorf("unexpected key %q in an error", k)
			}
		}
		if msg, _ := e["message"].(string); msg == "" {
			t.Errorf("error without message: %s", r.body)
		}
		if e["code"] == w.code && (w.field == "" || e["path"] == w.field || e["param"] == w.field) {
			found = true
		}
	}
	if !found {
		t.Errorf("no error with code %s and path %q: %s", w.code, w.field, r.body)
	}
	return entries
}

// checkProblem checks the join-codes API's application/problem+json: type, title,
// status, requestId and code are required; errors[] names fields.
func checkProblem(t *testing.T, r response, w want) {
	t.Helper()
	if r.status != w.status {
		t.Fatalf("status %d, want %d\n%s", r.status, w.status, r.body)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("Content-Type %q, want application/problem+json", ct)
	}
	p := r.json(t)
	for _, k := range []string{"type", "title", "status", "requestId", "code"} {
		if _, ok := p[k]; !ok {
			t.Errorf("problem lacks %s: %s", k, r.body)
		}
	}
	if typ, _ := p["type"].(string); !strings.HasPrefix(typ, "https://") {
		t.Errorf("type %q is not a URI", typ)
	}
	if st, _ := p["status"].(float64); int(st) != w.status {
		t.Errorf("status field %v, want %d", p["status"], w.status)
	}
	if p["code"] != w.code {
		t.Errorf("code %v, want %s\n%s", p["code"], w.code, r.body)
	}
	if p["requestId"] != r.header.Get("X-Request-Id") {
		t.Errorf("requestId %v, header %q", p["requestId"], r.header.Get("X-Request-Id"))
	}
	if w.field == "" {
		return
	}
	errs, _ := p["errors"].([]any)
	for _, e := range errs {
		if e.(map[string]any)["field"] == w.field {
			return
		}
	}
	t.Errorf("no errors[] entry for field %q: %s", w.field, r.body)
}
