package adminapi_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/stratumjoin/stratum/listener/adminapi"
)

const openapiFile = "../../api/openapi.yaml"

func loadOpenAPI(t *testing.T) map[string]any {
	t.Helper()
	raw, err := os.ReadFile(filepath.FromSlash(openapiFile))
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := yaml.UnmarshalStrict(raw, &doc); err != nil {
		t.Fatalf("api/openapi.yaml: %v", err)
	}
	return doc
}

// TestOpenAPIListsExactlyTheServedRoutes compares the document's paths and
// methods with the routes the server registers, both ways.
func TestOpenAPIListsExactlyTheServedRoutes(t *testing.T) {
	doc := loadOpenAPI(t)
	if v, _ := doc["openapi"].(string); !strings.HasPrefix(v, "3.1.") {
		t.Errorf("openapi %q, want 3.1.x", v)
	}
	var documented []string
	for path, item := range doc["paths"].(map[string]any) {
		for method := range item.(map[string]any) {
			switch method {
			case "get", "post", "put", "patch", "delete", "head", "options", "trace":
				documented = append(documented, strings.ToUpper(method)+" "+path)
			}
		}
	}
	slices.Sort(documented)
	served := adminapi.Routes()
	for _, r := range served {
		if !slices.Contains(documented, r) {
			t.Errorf("served but not documented: %s", r)
		}
	}
	for _, d := range documented {
		if !slices.Contains(served, d) {
			t.Errorf("documented but not served: %s", d)
		}
	}
	if len(served) == 0 {
		t.Fatal("no routes")
	}
}

// TestOpenAPIRefsAndCodes checks that every $ref resolves and that the
// error code enums name every code the server answers with.
func TestOpenAPIRefsAndCodes(t *testing.T) {
	doc := loadOpenAPI(t)
	var walk func(v any)
	walk = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			if ref, ok := x["$ref"].(string); ok {
				if resolve(doc, ref) == nil {
					t.Errorf("unresolved $ref %s", ref)
				}
			}
			for _, c := range x {
				walk(c)
			}
		case []any:
			for _, c := range x {
				walk(c)
			}
		}
	}
	walk(doc)

	enum := func(ref string) []string {
		var out []string
		for _, v := range resolve(doc, ref).(map[string]any)["enum"].([]any) {
			out = append(out, v.(string))
		}
		return out
	}
	codes := map[string][]string{
		"#/components/schemas/TokenError/properties/error/properties/code": {
			adminapi.TokenInvalidInput, adminapi.TokenNotFound, adminapi.TokenConflict, adminapi.TokenInvalidState,
			adminapi.TokenUnauthenticated, adminapi.TokenPermissionDenied, adminapi.TokenMethod, adminapi.TokenInternal,
			adminapi.TokenUnavailable,
		},
		"#/components/schemas/KeyErrors/properties/errors/items/properties/code": {
			adminapi.KeyErrDuplicateValue, adminapi.KeyErrLimitExceeded, adminapi.KeyErrUnauthorized, adminapi.KeyErrForbidden,
			adminapi.KeyErrTooMany, adminapi.KeyErrNotFound, adminapi.KeyErrMethod, adminapi.KeyErrInternal, adminapi.KeyErrUnavailable,
			"ERR_INVALID_VALUE", "ERR_MISSING_VALUE", "ERR_INVALID_REFERENCE",
		},
		"#/components/schemas/Problem/properties/code": {
			adminapi.CodeInvalidInput, adminapi.CodeNotFound, adminapi.CodeForbidden, adminapi.CodeUnauthorized, adminapi.CodeLimitExceeded,
			adminapi.CodeInvalidState, adminapi.CodeConflict, adminapi.CodeInternal, adminapi.CodeMethod, adminapi.CodeTooMany, adminapi.CodeUnavailable, adminapi.CodeApprovalRefused,
		},
		"#/components/schemas/Grant/properties/action":               adminapi.Actions(),
		"#/components/schemas/APIKeyRequest/properties/scopes/items": adminapi.Scopes(),
	}
	for ref, want := range codes {
		got := enum(ref)
		slices.Sort(got)
		w := slices.Clone(want)
		slices.Sort(w)
		if !slices.Equal(got, w) {
			t.Errorf("%s enum %v, want %v", ref, got, w)
		}
	}
}

// resolve follows a local JSON pointer, or returns nil.
func resolve(doc map[string]any, ref string) any {
	var cur any = doc
	for _, part := range strings.Split(strings.TrimPrefix(ref, "#/"), "/") {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		if cur, ok = m[strings.ReplaceAll(strings.ReplaceAll(part, "~1", "/"), "~0", "~")]; !ok {
			return nil
		}
	}
	return cur
}
