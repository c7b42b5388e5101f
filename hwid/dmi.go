package hwid

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/jaypipes/ghw"
	"github.com/stratumjoin/stratum/internal/identity"
	"github.com/stratumjoin/stratum/internal/wire"
)

// ghwUnknown is what ghw returns, without an error, for a DMI file it could
// not read (missing, or root-only and we are not root).
const ghwUnknown = "unknown"

// dmiField is one SMBIOS fact and where ghw reads it from.
type dmiField struct {
	fact  string // key in Report.Sources
	label string // what notes call it
	kind  string // IsPlaceholder kind
	// identity fields pin a machine; the others only describe it, which
	// changes how a dropped value is explained.
	identity bool
	dmiFile  string // under /sys/class/dmi/id
	dtFile   string // under /sys/firmware/devicetree/base; "" = the device tree has none
	value    func(p *ghw.ProductInfo, b *ghw.BaseboardInfo) string
	set      func(f *wire.Facts, v string)
}

var dmiFields = []dmiField{
	{
		fact: FactProductUUID, label: "product UUID", kind: identity.KindProductUUID, identity: true,
		dmiFile: "product_uuid",
		value:   func(p *ghw.ProductInfo, _ *ghw.BaseboardInfo) string { return p.UUID },
		set:     func(f *wire.Facts, v string) { f.ProductUUID = v },
	},
	{
		fact: FactSerial, label: "product serial", kind: identity.KindSerial, identity: true,
		dmiFile: "product_serial", dtFile: "serial-number",
		value: func(p *ghw.ProductInfo, _ *ghw.BaseboardInfo) string { return p.SerialNumber },
		set:   func(f *wire.Facts, v string) { f.Serial = v },
	},
	{
		// On a device tree ghw reports the one serial-number as the
		// board's too; dtFile stays empty so it is not reported twice.
		fact: FactBoardSerial, label: "board serial", kind: identity.KindBoardSerial, identity: true,
		dmiFile: "board_serial",
		value:   func(_ *ghw.ProductInfo, b *ghw.BaseboardInfo) string { return b.SerialNumber },
		set:     func(f *wire.Facts, v string) { f.BoardSerial = v },
	},
	{
		fact: FactVendor, label: "vendor", kind: identity.KindVendor,
		dmiFile: "sys_vendor", dtFile: "compatible",
		value: func(p *ghw.ProductInfo, _ *ghw.BaseboardInfo) string { return p.Vendor },
		set:   func(f *wire.Facts, v string) { f.Vendor = v },
	},
	{
		fact: FactProductName, label: "product name", kind: identity.KindProductName,
		dmiFile: "product_name", dtFile: "model",
		value: func(p *ghw.ProductInfo, _ *ghw.BaseboardInfo) string { return p.Name },
		set:   func(f *wire.Facts, v string) { f.ProductName = v },
	},
}

// collectDMI fills the SMBIOS facts of the machine whose filesystem is at
// root. Like ghw it falls back to the device tree (ARM boards without
// SMBIOS) when /sys/class/dmi/id is absent.
func collectDMI(ctx context.Context, root string, r *Report, log *slog.Logger) {
	dmiDir := filepath.Join(root, "sys", "class", "dmi", "id")
	dtDir := filepath.Join(root, "sys", "firmware", "devicetree", "base")
	hasDMI, hasDT := isDir(dmiDir), isDir(dtDir)
	if !hasDMI && !hasDT {
		r.notef("no SMBIOS data: %s does not exist, so no product UUID, serials, vendor or product name", dmiDir)
		return
	}

	opts := []any{
		// ctx first: it replaces the context ghw would build from
		// GHW_* environment variables, so only these options count.
		ctx,
		ghw.WithChroot(root),
		ghw.WithDisableWarnings(),
		// ghw warns about every file it cannot read, on stderr by
		// default; the notes already explain those, so its messages go to
		// our logger at debug level and never to stderr.
		ghw.WithLogger(slog.New(debugHandler{log.Handler()}).With("probe", "ghw")),
	}
	product, err := ghw.Product(opts...)
	if err != nil {
		r.notef("no product facts: ghw: %v", err)
		product = &ghw.ProductInfo{}
	}
	board, err := ghw.Baseboard(opts...)
	if err != nil {
		r.notef("no board facts: ghw: %v", err)
		board = &ghw.BaseboardInfo{}
	}

	for _, f := range dmiFields {
		path, how := filepath.Join(dmiDir, f.dmiFile), "ghw"
		if !hasDMI {
			if f.dtFile == "" {
				r.notef("no %s: %s does not exist and the device tree has none", f.label, dmiDir)
				continue
			}
			path, how = filepath.Join(dtDir, f.dtFile), "ghw, device tree"
		}
		value := strings.TrimSpace(f.value(product, board))
		if value == ghwUnknown {
			// ghw says the same for a missing file, an unreadable one and
			// one that really holds "unknown"; only the last is a value
			// (a placeholder, dropped below).
			if why := unreadable(path); why != "" {
				r.notef("no %s: %s", f.label, why)
				continue
			}
		}
		if f.kind == identity.KindProductUUID {
			value = identity.NormalizeUUID(value)
		}
		if reason := identity.PlaceholderReason(f.kind, value); reason != "" {
			if f.identity {
				r.notef("%s %q is %s, not an identity", f.label, value, reason)
			} else {
				r.notef("%s %q is %s, not a real value", f.label, value, reason)
			}
			continue
		}
		if f.kind == identity.KindProductUUID && !identity.IsUUID(value) {
			r.notef("%s %q is not a UUID, not an identity", f.label, value)
			continue
		}
		f.set(&r.Facts, value)
		r.Sources[f.fact] = path + " (" + how + ")"
	}
}

// unreadable explains why ghw got nothing from path, or returns "" when the
// file reads fine (then "unknown" really is what the firmware says).
func unreadable(path string) string {
	_, err := os.ReadFile(path)
	switch {
	case err == nil:
		return ""
	case errors.Is(err, fs.ErrNotExist):
		return path + " does not exist"
	case errors.Is(err, fs.ErrPermission):
		return path + " is not readable (the kernel makes it root-only: run as root or with CAP_DAC_READ_SEARCH)"
	default:
		return err.Error()
	}
}

func isDir(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.IsDir()
}

// debugHandler passes records to the wrapped handler at debug level.
type debugHandler struct{ h slog.Handler }

func (d debugHandler) Enabled(ctx context.Context, _ slog.Level) bool {
	return d.h.Enabled(ctx, slog.LevelDebug)
}

func (d debugHandler) Handle(ctx context.Context, rec slog.Record) error {
	rec.Level = slog.LevelDebug
	return d.h.Handle(ctx, rec)
}

func (d debugHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return debugHandler{d.h.WithAttrs(attrs)}
}

func (d debugHandler) WithGroup(name string) slog.Handler {
	return debugHandler{d.h.WithGroup(name)}
}
