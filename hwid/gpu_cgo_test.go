//go:build cgo

package hwid

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/stratumjoin/stratum/internal/identity"
)

func TestNVMLDGXH100(t *testing.T) {
	srv := dgxh100.New()
	var want []string
	for _, d := range srv.Devices {
		uuid, ret := d.GetUUID()
		if ret != nvml.SUCCESS {
			t.Fatalf("mock GetUUID: %v", ret)
		}
		want = append(want, uuid)
	}
	slices.Sort(want)
	if len(want) != 8 {
		t.Fatalf("precondition: the DGX H100 mock has %d GPUs, want 8", len(want))
	}

	r, err := Collect(context.Background(), Config{
		Root:          copyMachine(t, "dgx-h100", t.TempDir()),
		NetlinkHandle: newTestNetns(t),
		GPUs:          NewNVMLProber(srv),
		Hostname:      testHostname,
	})
	if err != nil {
		t.Fatalf("Collect: %v", err)
	}
	if !reflect.DeepEqual(r.Facts.GPUUUIDs, want) {
		t.Errorf("GPU UUIDs:\n got %q\nwant %q", r.Facts.GPUUUIDs, want)
	}
	if got, want := r.Sources[FactGPUUUIDs], "NVML (driver 550.54.15)"; got != want {
		t.Errorf("GPU source = %q, want %q", got, want)
	}
	for _, n := range r.Notes {
		if strings.Contains(n, "GPU") || strings.Contains(n, "NVML") {
			t.Errorf("unexpected GPU note %q", n)
		}
	}
	if got := len(srv.InitCalls()); got != 1 {
		t.Errorf("Init called %d times, want 1", got)
	}
	if got := len(srv.ShutdownCalls()); got != 1 {
		t.Errorf("Shutdown called %d times, want 1 (NVML must be shut down after use)", got)
	}
}

// failedInit is an NVML whose Init fails. Any other call fails the test:
// with the real library such a call kills the process.
func failedInit(t *testing.T, ret nvml.Return) *mock.Interface {
	forbidden := func(name string) {
		t.Errorf("NVML %s called after Init returned %d: this kills a real process", name, int32(ret))
		panic("NVML called after a failed Init")
	}
	return &mock.Interface{
		InitFunc:     func() nvml.Return { return ret },
		ShutdownFunc: func() nvml.Return { forbidden("Shutdown"); return nvml.SUCCESS },
		DeviceGetCountFunc: func() (int, nvml.Return) {
			forbidden("DeviceGetCount")
			return 0, nvml.SUCCESS
		},
		DeviceGetHandleByIndexFunc: func(int) (nvml.Device, nvml.Return) {
			forbidden("DeviceGetHandleByIndex")
			return nil, nvml.SUCCESS
		},
		SystemGetDriverVersionFunc: func() (string, nvml.Return) {
			forbidden("SystemGetDriverVersion")
			return "", nvml.SUCCESS
		},
		// Every other method of mock.Interface is nil and panics when
		// called, which fails the test as well.
	}
}

func TestNVMLInitFails(t *testing.T) {
	tests := []struct {
		ret      nvml.Return
		wantNote string
	}{
		{nvml.ERROR_LIBRARY_NOT_FOUND, "no GPU UUIDs: NVML: libnvidia-ml.so.1 could not be loaded (no NVIDIA driver installed)"},
		{nvml.ERROR_DRIVER_NOT_LOADED, "no GPU UUIDs: NVML: the NVIDIA kernel driver is not loaded"},
		{nvml.ERROR_NO_PERMISSION, "no GPU UUIDs: NVML: no permission to open the NVIDIA devices"},
		{nvml.ERROR_LIB_RM_VERSION_MISMATCH, "no GPU UUIDs: NVML: the NVML library and the kernel driver are different versions (reload the driver or reboot)"},
		{nvml.ERROR_UNKNOWN, "no GPU UUIDs: NVML: init failed with NVML return code 999"},
	}
	for _, tt := range tests {
		t.Run(tt.wantNote, func(t *testing.T) {
			lib := failedInit(t, tt.ret)
			r := Report{Sources: map[string]string{}}
			collectGPUs(context.Background(), NewNVMLProber(lib), &r)
			if len(r.Facts.GPUUUIDs) != 0 || r.Sources[FactGPUUUIDs] != "" {
				t.Errorf("GPUs %q from %q, want none", r.Facts.GPUUUIDs, r.Sources[FactGPUUUIDs])
			}
			if want := []string{tt.wantNote}; !reflect.DeepEqual(r.Notes, want) {
				t.Errorf("notes = %q, want %q", r.Notes, want)
			}
			if got := len(lib.InitCalls()); got != 1 {
				t.Errorf("Init called %d times, want 1", got)
			}
		})
	}
}

// TestNVMLRealLibrary runs the real nvml.New(). Without libnvidia-ml (the
// CI machine) it proves the no-driver path of the real library: no GPUs,
// exactly one note, and a process that lives on. With a driver it must list
// well-formed UUIDs or say why not.
func TestNVMLRealLibrary(t *testing.T) {
	present := nvidiaLibraryPresent()
	r := Report{Sources: map[string]string{}}
	collectGPUs(context.Background(), NewNVMLProber(nil), &r)
	t.Logf("libnvidia-ml present: %v; GPUs %q from %q, notes %q", present, r.Facts.GPUUUIDs, r.Sources[FactGPUUUIDs], r.Notes)
	if !present {
		want := []string{"no GPU UUIDs: NVML: libnvidia-ml.so.1 could not be loaded (no NVIDIA driver installed)"}
		if len(r.Facts.GPUUUIDs) != 0 || !reflect.DeepEqual(r.Notes, want) {
			t.Errorf("GPUs %q, notes %q; want none and %q", r.Facts.GPUUUIDs, r.Notes, want)
		}
		return
	}
	if len(r.Facts.GPUUUIDs) == 0 {
		if len(r.Notes) == 0 || !strings.HasPrefix(r.Notes[0], "no GPU UUIDs: NVML") {
			t.Errorf("library present, no GPUs, notes %q: want a note saying why", r.Notes)
		}
		return
	}
	if !strings.HasPrefix(r.Sources[FactGPUUUIDs], "NVML (driver ") {
		t.Errorf("source %q does not name the driver", r.Sources[FactGPUUUIDs])
	}
	for _, u := range r.Facts.GPUUUIDs {
		if n, err := identity.NormalizeGPUUUID(u); err != nil || n != u {
			t.Errorf("GPU UUID %q not normalised (%q, %v)", u, n, err)
		}
	}
}

// nvidiaLibraryPresent looks for libnvidia-ml.so.1 where the dynamic linker
// would find it, without loading it.
func nvidiaLibraryPresent() bool {
	if out, err := exec.Command("ldconfig", "-p").Output(); err == nil && strings.Contains(string(out), "libnvidia-ml.so.1") {
		return true
	}
	dirs := filepath.SplitList(os.Getenv("LD_LIBRARY_PATH"))
	dirs = append(dirs, "/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/lib64", "/lib",
		"/usr/local/nvidia/lib64", "/usr/local/cuda/lib64")
	for _, dir := range dirs {
		if _, err := os.Stat(filepath.Join(dir, "libnvidia-ml.so.1")); err == nil {
			return true
		}
	}
	return false
}

func TestNVMLDeviceErrors(t *testing.T) {
	good := "GPU-8c8e2d4a-5b7f-1e3c-9d0a-6f1b2c3d4e5f"
	devices := []nvml.Device{
		&mock.Device{GetUUIDFunc: func() (string, nvml.Return) { return good, nvml.SUCCESS }},
		&mock.Device{GetUUIDFunc: func() (string, nvml.Return) { return "", nvml.ERROR_GPU_IS_LOST }},
		nil, // handle fails
		&mock.Device{GetUUIDFunc: func() (string, nvml.Return) { return "GPU-00000000-0000-0000-0000-000000000000", nvml.SUCCESS }},
		&mock.Device{GetUUIDFunc: func() (string, nvml.Return) { return "garbage", nvml.SUCCESS }},
		&mock.Device{GetUUIDFunc: func() (string, nvml.Return) { return strings.ToUpper(good), nvml.SUCCESS }}, // same GPU twice
	}
	lib := &mock.Interface{
		InitFunc:                   func() nvml.Return { return nvml.SUCCESS },
		ShutdownFunc:               func() nvml.Return { return nvml.SUCCESS },
		SystemGetDriverVersionFunc: func() (string, nvml.Return) { return "", nvml.ERROR_NOT_SUPPORTED },
		DeviceGetCountFunc:         func() (int, nvml.Return) { return len(devices), nvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(i int) (nvml.Device, nvml.Return) {
			if devices[i] == nil {
				return nil, nvml.ERROR_UNKNOWN
			}
			return devices[i], nvml.SUCCESS
		},
	}
	r := Report{Sources: map[string]string{}}
	collectGPUs(context.Background(), NewNVMLProber(lib), &r)
	if want := []string{good}; !reflect.DeepEqual(r.Facts.GPUUUIDs, want) {
		t.Errorf("GPU UUIDs = %q, want %q", r.Facts.GPUUUIDs, want)
	}
	if got := r.Sources[FactGPUUUIDs]; got != "NVML" {
		t.Errorf("source = %q, want NVML", got)
	}
	wantNotes := []string{
		"GPU 1 not reported: NVML UUID: " + nvml.ERROR_GPU_IS_LOST.Error(),
		"GPU 2 not reported: NVML handle: " + nvml.ERROR_UNKNOWN.Error(),
		`GPU UUID "GPU-00000000-0000-0000-0000-000000000000" is all zeros, not an identity`,
		`GPU UUID "garbage" is not "GPU-" followed by a UUID, not an identity`,
	}
	if !reflect.DeepEqual(r.Notes, wantNotes) {
		t.Errorf("notes:\n got %q\nwant %q", r.Notes, wantNotes)
	}
	if len(lib.ShutdownCalls()) != 1 {
		t.Errorf("Shutdown called %d times, want 1", len(lib.ShutdownCalls()))
	}
}

func TestNVMLNoDevices(t *testing.T) {
	lib := &mock.Interface{
		InitFunc:                   func() nvml.Return { return nvml.SUCCESS },
		ShutdownFunc:               func() nvml.Return { return nvml.ERROR_UNKNOWN },
		SystemGetDriverVersionFunc: func() (string, nvml.Return) { return "550.54.15", nvml.SUCCESS },
		DeviceGetCountFunc:         func() (int, nvml.Return) { return 0, nvml.SUCCESS },
	}
	r := Report{Sources: map[string]string{}}
	collectGPUs(context.Background(), NewNVMLProber(lib), &r)
	want := []string{"no GPU UUIDs: NVML sees no GPUs", "NVML shutdown: " + nvml.ERROR_UNKNOWN.Error()}
	if len(r.Facts.GPUUUIDs) != 0 || !reflect.DeepEqual(r.Notes, want) {
		t.Errorf("GPUs %q, notes %q; want none and %q", r.Facts.GPUUUIDs, r.Notes, want)
	}
}
