package arch

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// parseDir parses the non-test Go files of a package directory.
func parseDir(t *testing.T, dir string) []*ast.File {
	t.Helper()
	matches, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	fset := token.NewFileSet()
	for _, m := range matches {
		if strings.HasSuffix(m, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, m, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	if len(files) == 0 {
		t.Fatalf("no Go files in %s", dir)
	}
	return files
}

// storeKeyPrefixes reads the key prefixes internal/cluster/keys.go declares.
func storeKeyPrefixes(t *testing.T) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "../../internal/cluster/keys.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	ast.Inspect(f, func(n ast.Node) bool {
		vs, ok := n.(*ast.ValueSpec)
		if !ok {
			return true
		}
		for _, v := range vs.Values {
			if lit, ok := v.(*ast.BasicLit); ok && lit.Kind == token.STRING {
				s, _ := strconv.Unquote(lit.Value)
				out = append(out, s)
			}
		}
		return true
	})
	if len(out) < 10 {
		t.Fatalf("found only %d key prefixes in keys.go: %v", len(out), out)
	}
	return out
}

// TestFacadesCannotReachStoreKeys: the admin facades reach the store only
// through the typed methods of internal/cluster. They do not import the
// store, no exported method of Cluster hands out or takes a store type,
// and no facade source holds a store key prefix.
func TestFacadesCannotReachStoreKeys(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{join .Imports "\n"}}`, module+"/listener/adminapi").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, imp := range strings.Fields(string(out)) {
		if strings.HasPrefix(imp, module+"/internal/store") || strings.HasPrefix(imp, "go.etcd.io/") {
			t.Errorf("listener/adminapi imports %s", imp)
		}
	}

	// exported methods and functions of cluster: no store type in or out
	// (New takes the Config that names the store, which is the one way in)
	for _, f := range parseDir(t, "../../internal/cluster") {
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || !fn.Name.IsExported() || fn.Name.Name == "New" {
				continue
			}
			var fields []*ast.Field
			fields = append(fields, fn.Type.Params.List...)
			if fn.Type.Results != nil {
				fields = append(fields, fn.Type.Results.List...)
			}
			for _, fl := range fields {
				ast.Inspect(fl.Type, func(n ast.Node) bool {
					if sel, ok := n.(*ast.SelectorExpr); ok {
						if id, ok := sel.X.(*ast.Ident); ok && id.Name == "store" {
							t.Errorf("cluster.%s exposes store.%s", fn.Name.Name, sel.Sel.Name)
						}
					}
					return true
				})
			}
		}
	}

	prefixes := storeKeyPrefixes(t)
	for _, f := range parseDir(t, "../../listener/adminapi") {
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			s, _ := strconv.Unquote(lit.Value)
			for _, p := range prefixes {
				if strings.HasPrefix(s, p) {
					t.Errorf("listener/adminapi holds the string %q, which starts with the store key prefix %q", s, p)
				}
			}
			return true
		})
	}
}
