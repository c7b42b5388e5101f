package hwid

import (
	"context"
	"slices"
	"strings"

	"github.com/stratumjoin/stratum/internal/identity"
)

// GPUProber lists the UUIDs of a machine's GPUs. Collect uses NVML unless
// Config.GPUs names another prober (a fake in tests).
type GPUProber interface {
	ProbeGPUs(ctx context.Context) GPUResult
}

// GPUResult is what a GPUProber found. A prober reports problems as notes:
// a machine without GPUs or without a driver is normal, not an error.
type GPUResult struct {
	UUIDs  []string // "GPU-" followed by a UUID, as nvidia-smi -L prints them
	Source string   // e.g. "NVML (driver 550.54.15)"
	Notes  []string
}

// collectGPUs runs p and keeps the well-formed, non-placeholder UUIDs,
// normalised, deduplicated and sorted.
func collectGPUs(ctx context.Context, p GPUProber, r *Report) {
	res := p.ProbeGPUs(ctx)
	r.Notes = append(r.Notes, res.Notes...)
	var uuids []string
	for _, raw := range res.UUIDs {
		u, err := identity.NormalizeGPUUUID(raw)
		if err != nil {
			r.notef("GPU UUID %q is not \"GPU-\" followed by a UUID, not an identity", raw)
			continue
		}
		if reason := identity.PlaceholderReason(identity.KindGPUUUID, u); reason != "" {
			r.notef("GPU UUID %q is %s, not an identity", u, reason)
			continue
		}
		uuids = append(uuids, u)
	}
	slices.Sort(uuids)
	uuids = slices.Compact(uuids)
	if len(uuids) == 0 {
		return
	}
	r.Facts.GPUUUIDs = uuids
	source := strings.TrimSpace(res.Source)
	if source == "" {
		source = "GPU prober"
	}
	r.Sources[FactGPUUUIDs] = source
}
