//go:build !cgo

package hwid

import (
	"context"
	"reflect"
	"testing"
)

func TestDefaultGPUProberWithoutCgo(t *testing.T) {
	r := Report{Sources: map[string]string{}}
	collectGPUs(context.Background(), defaultGPUProber(), &r)
	want := []string{"no GPU UUIDs: this binary was built without cgo, so it cannot load NVML"}
	if len(r.Facts.GPUUUIDs) != 0 || !reflect.DeepEqual(r.Notes, want) {
		t.Errorf("GPUs %q, notes %q; want none and %q", r.Facts.GPUUUIDs, r.Notes, want)
	}
}
