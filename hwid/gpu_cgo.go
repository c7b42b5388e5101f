//go:build cgo

package hwid

import (
	"context"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// defaultGPUProber asks the NVIDIA driver through NVML.
func defaultGPUProber() GPUProber { return NewNVMLProber(nil) }

// NVMLProber lists NVIDIA GPU UUIDs through NVML.
type NVMLProber struct {
	lib nvml.Interface
}

// NewNVMLProber returns a prober that uses lib; nil means nvml.New(), which
// loads libnvidia-ml.so.1 when probing. Tests pass the go-nvml mocks.
func NewNVMLProber(lib nvml.Interface) *NVMLProber {
	return &NVMLProber{lib: lib}
}

// ProbeGPUs lists the UUID of every GPU NVML sees. A machine without the
// NVIDIA library or driver has no GPUs, which is a note, not an error.
func (p *NVMLProber) ProbeGPUs(ctx context.Context) (res GPUResult) {
	lib := p.lib
	if lib == nil {
		lib = nvml.New()
	}
	// Until Init succeeds, nothing else on lib may be called, Shutdown
	// included: when the library failed to load, the first call into it
	// kills the process from the dynamic linker (exit 127, not a panic).
	// Even Return.Error() may call into the library, hence initFailure.
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return GPUResult{Notes: []string{"no GPU UUIDs: NVML: " + initFailure(ret)}}
	}
	defer func() {
		if ret := lib.Shutdown(); ret != nvml.SUCCESS {
			res.Notes = append(res.Notes, "NVML shutdown: "+ret.Error())
		}
	}()

	res.Source = "NVML"
	if version, ret := lib.SystemGetDriverVersion(); ret == nvml.SUCCESS && version != "" {
		res.Source = "NVML (driver " + version + ")"
	}
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		res.Notes = append(res.Notes, "no GPU UUIDs: NVML device count: "+ret.Error())
		return res
	}
	for i := range n {
		if ctx.Err() != nil {
			res.Notes = append(res.Notes, fmt.Sprintf("GPU probe stopped after %d of %d GPUs: %v", i, n, ctx.Err()))
			break
		}
		dev, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			res.Notes = append(res.Notes, fmt.Sprintf("GPU %d not reported: NVML handle: %s", i, ret.Error()))
			continue
		}
		uuid, ret := dev.GetUUID()
		if ret != nvml.SUCCESS {
			res.Notes = append(res.Notes, fmt.Sprintf("GPU %d not reported: NVML UUID: %s", i, ret.Error()))
			continue
		}
		res.UUIDs = append(res.UUIDs, uuid)
	}
	if n == 0 {
		res.Notes = append(res.Notes, "no GPU UUIDs: NVML sees no GPUs")
	}
	return res
}

// initFailure explains a failed nvml Init without calling into the library.
func initFailure(ret nvml.Return) string {
	switch ret {
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		return "libnvidia-ml.so.1 could not be loaded (no NVIDIA driver installed)"
	case nvml.ERROR_DRIVER_NOT_LOADED:
		return "the NVIDIA kernel driver is not loaded"
	case nvml.ERROR_NO_PERMISSION:
		return "no permission to open the NVIDIA devices"
	case nvml.ERROR_LIB_RM_VERSION_MISMATCH:
		return "the NVML library and the kernel driver are different versions (reload the driver or reboot)"
	default:
		return fmt.Sprintf("init failed with NVML return code %d", int32(ret))
	}
}
