package registry_test

import (
	"os"
	"testing"

	"github.com/stratumjoin/stratum/listener/registry"
)

// FuzzParse: whatever the file holds, Parse returns a registry or an
// error, never panics, and a registry it returns is self-consistent.
func FuzzParse(f *testing.F) {
	example, err := os.ReadFile("testdata/example.yaml")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(example)
	f.Add([]byte(`{"tenants":[{"id":"a"}],"sites":[{"id":"s","owner":"platform"}],"pools":[{"id":"p","tenant":"a","site":"s","agent":"bcd"}]}`))
	f.Add([]byte("tenants: [{id: no}]"))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := registry.Parse(data)
		if err != nil {
			return
		}
		for _, p := range r.Pools {
			if _, ok := r.Pool(p.ID); !ok {
				t.Fatalf("pool %q parsed but not found", p.ID)
			}
		}
	})
}
