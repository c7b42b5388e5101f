//go:build !cgo

package hwid

import "context"

// defaultGPUProber reports no GPUs: NVML is a C library loaded at run time,
// which a binary built without cgo cannot do.
func defaultGPUProber() GPUProber { return noCgoProber{} }

type noCgoProber struct{}

func (noCgoProber) ProbeGPUs(context.Context) GPUResult {
	return GPUResult{Notes: []string{"no GPU UUIDs: this binary was built without cgo, so it cannot load NVML"}}
}
