//go:build cgo

package listener_test

import (
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"

	"github.com/stratumjoin/stratum/hwid"
	"github.com/stratumjoin/stratum/internal/cluster"
)

// TestExpectPinsTheGPU pins a code to one GPU of a DGX H100 (go-nvml's
// mock, read through hwid's NVML prober): that DGX joins; another DGX,
// whose GPUs have other UUIDs (the mock makes fresh ones per server), and
// a machine without GPUs are refused.
func TestExpectPinsTheGPU(t *testing.T) {
	ours, theirs := dgxh100.New(), dgxh100.New()
	uuid, ret := ours.Devices[5].GetUUID()
	if ret != nvml.SUCCESS {
		t.Fatalf("mock GetUUID: %v", ret)
	}
	right := dgxFacts(t, hwid.NewNVMLProber(ours))
	wrong := dgxFacts(t, hwid.NewNVMLProber(theirs))
	if len(right.GPUUUIDs) != 8 || len(wrong.GPUUUIDs) != 8 {
		t.Fatalf("precondition: the DGX H100 mocks report %d and %d GPUs, want 8", len(right.GPUUUIDs), len(wrong.GPUUUIDs))
	}
	t.Run("another DGX", func(t *testing.T) {
		// as an operator may type it: upper case, matched as a member of the set
		upper := "GPU-" + strings.ToUpper(strings.TrimPrefix(uuid, "GPU-"))
		checkPin(t, pinCase{expect: cluster.Expect{GPUUUID: upper}, field: "gpuUuid", right: right, wrong: wrong})
	})
	t.Run("no GPUs", func(t *testing.T) {
		checkPin(t, pinCase{expect: cluster.Expect{GPUUUID: uuid}, field: "gpuUuid", right: right, wrong: dellFacts(t)})
	})
}
