// Package hwid collects the hardware identity a Stratum Join agent reports:
// the SMBIOS product UUID and serials, vendor and product name (through
// ghw, from /sys/class/dmi/id below a root directory), the MACs of physical
// NICs (netlink), the UUIDs of NVIDIA GPUs (NVML, loaded at run time) and
// the hostname.
//
// Every fact is claimed, not attested: the machine reports what its
// firmware and kernel say, and anyone with root on it can change that. The
// facts are still useful to pin a join code to the machine an operator
// meant (`expect`) and to recognise a machine that joins again.
//
// Values that firmware ships when nobody programmed a real one ("To Be
// Filled By O.E.M.", the AMI template UUID 03000200-0400-0500-0006-
// 000700080009, all-zero UUIDs, ...) are shared by many machines, so they
// are dropped rather than reported. The rules live in internal/identity,
// which the listener applies to `expect` pins too. Everything dropped or
// missing is explained in Report.Notes, and Report.Sources says where each
// reported fact came from, so `stratum-agent hwid` can show an operator why
// a machine reports what it does.
//
// Collect is best-effort: a missing DMI table, an absent NVIDIA driver or a
// GPU that does not answer become notes, not errors. It fails only when the
// context ends or the network links cannot be listed at all.
package hwid

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/stratumjoin/stratum/internal/wire"
	"github.com/vishvananda/netlink"
)

// Names of the facts, as keys of Report.Sources. They are the JSON names of
// the wire.Facts fields.
const (
	FactProductUUID = "productUuid"
	FactSerial      = "serial"
	FactBoardSerial = "boardSerial"
	FactVendor      = "vendor"
	FactProductName = "productName"
	FactMACs        = "macs"
	FactGPUUUIDs    = "gpuUuids"
	FactHostname    = "hostname"
)

// Config says where Collect looks. The zero value probes the running
// machine.
type Config struct {
	// Root is the filesystem root the DMI probe reads below: "/" (or "")
	// in production, a tree such as testdata/sysfs/dell-r760 in tests.
	Root string

	// IncludeInterfaces names interfaces that count as NICs even though
	// they are virtual (a VM's virtio NIC without a bus, a test
	// namespace's veth). Each one included this way is noted.
	IncludeInterfaces []string

	// NetlinkHandle lists the links of another network namespace; nil
	// means the current one. Only for the current namespace may a link
	// without a parent bus still count as physical through
	// /sys/class/net/NAME/device: sysfs shows the namespace it was mounted
	// from, which is the live one whatever Root says, so that check never
	// reads below Root.
	NetlinkHandle *netlink.Handle

	// GPUs lists GPU UUIDs. nil means NVML through nvml.New() on cgo
	// builds (see NewNVMLProber to inject an nvml.Interface) and no GPUs,
	// with a note, on builds without cgo.
	GPUs GPUProber

	// Hostname, when not empty, is reported instead of os.Hostname().
	Hostname string

	// Logger receives debug detail (ghw's own messages, skipped links);
	// nil discards it. Nothing is ever written to stdout or stderr.
	Logger *slog.Logger
}

// Report is what Collect found. It marshals to JSON as
// {"facts": {...}, "sources": {...}, "notes": [...]}.
type Report struct {
	// Facts are the normalised claims the agent sends.
	Facts wire.Facts `json:"facts"`
	// Sources maps a fact name (the Fact constants) to where it came
	// from, e.g. "productUuid": "/sys/class/dmi/id/product_uuid (ghw)".
	Sources map[string]string `json:"sources"`
	// Notes say why a fact was dropped or is absent.
	Notes []string `json:"notes"`
}

// Collect probes the machine described by cfg. On error the Report still
// holds what was collected before the failure.
func Collect(ctx context.Context, cfg Config) (Report, error) {
	r := Report{Sources: map[string]string{}, Notes: []string{}}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	root := cfg.Root
	if root == "" {
		root = "/"
	}

	if err := ctx.Err(); err != nil {
		return r, fmt.Errorf("collect hardware identity: %w", err)
	}
	collectDMI(ctx, root, &r, log)

	if err := ctx.Err(); err != nil {
		return r, fmt.Errorf("collect hardware identity: %w", err)
	}
	if err := collectMACs(ctx, cfg, &r, log); err != nil {
		return r, fmt.Errorf("collect hardware identity: %w", err)
	}

	if err := ctx.Err(); err != nil {
		return r, fmt.Errorf("collect hardware identity: %w", err)
	}
	gpus := cfg.GPUs
	if gpus == nil {
		gpus = defaultGPUProber()
	}
	collectGPUs(ctx, gpus, &r)

	collectHostname(cfg.Hostname, &r)
	return r, nil
}

func collectHostname(override string, r *Report) {
	if override != "" {
		r.Facts.Hostname = strings.TrimSpace(override)
		r.Sources[FactHostname] = "Config.Hostname"
		return
	}
	name, err := os.Hostname()
	if err != nil {
		r.notef("no hostname: %v", err)
		return
	}
	name = strings.TrimSpace(name)
	if name == "" {
		r.notef("no hostname: the kernel's hostname is empty")
		return
	}
	r.Facts.Hostname = name
	r.Sources[FactHostname] = "os.Hostname"
}

func (r *Report) notef(format string, args ...any) {
	r.Notes = append(r.Notes, fmt.Sprintf(format, args...))
}
