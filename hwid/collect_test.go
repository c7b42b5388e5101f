package hwid

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/jaypipes/ghw"
	"github.com/stratumjoin/stratum/internal/wire"
)

// emptyNetnsNotes are the MAC notes for a namespace holding only lo.
var emptyNetnsNotes = []string{
	"no MAC: no physical NIC found",
	"not counted as NICs: lo (loopback)",
}

const testHostname = "gpu-node-17"

func dmiPath(root, file string) string {
	return filepath.Join(root, "sys", "class", "dmi", "id", file)
}

// allDMISources is what a machine reporting every DMI fact gives as sources.
func allDMISources(root string) map[string]string {
	return map[string]string{
		FactProductUUID: dmiPath(root, "product_uuid") + " (ghw)",
		FactSerial:      dmiPath(root, "product_serial") + " (ghw)",
		FactBoardSerial: dmiPath(root, "board_serial") + " (ghw)",
		FactVendor:      dmiPath(root, "sys_vendor") + " (ghw)",
		FactProductName: dmiPath(root, "product_name") + " (ghw)",
		FactHostname:    "Config.Hostname",
	}
}

func TestCollectMachines(t *testing.T) {
	h := newTestNetns(t)
	tests := []struct {
		machine string // directory in testdata/sysfs; "" = an empty root
		facts   wire.Facts
		sources func(root string) map[string]string
		// dmiNotes are the notes of the DMI probe; the MAC and GPU notes
		// of the empty namespace and fake prober follow them.
		dmiNotes func(root string) []string
	}{
		{
			machine: "dgx-h100",
			facts: wire.Facts{
				ProductUUID: "3B6E1C5A-8F2D-11EE-A1C4-7CC2554D9E30",
				Serial:      "1660423004819",
				BoardSerial: "1652823018273",
				Vendor:      "NVIDIA",
				ProductName: "DGXH100",
				Hostname:    testHostname,
			},
			sources:  allDMISources,
			dmiNotes: func(string) []string { return nil },
		},
		{
			machine: "supermicro-gpu",
			facts: wire.Facts{
				ProductUUID: "00000000-0000-0000-0000-3CECEFA1B2C3",
				Serial:      "S452388X3A20165",
				BoardSerial: "OM234S601187",
				Vendor:      "Supermicro",
				ProductName: "SYS-821GE-TNHR",
				Hostname:    testHostname,
			},
			sources:  allDMISources,
			dmiNotes: func(string) []string { return nil },
		},
		{
			machine: "dell-r760",
			facts: wire.Facts{
				ProductUUID: "4C4C4544-0037-5810-804A-B2C04F4B5133",
				Serial:      "7XJ2KQ3",
				BoardSerial: ".7XJ2KQ3.CNFCP0035B004H.",
				Vendor:      "Dell Inc.",
				ProductName: "PowerEdge R760",
				Hostname:    testHostname,
			},
			sources:  allDMISources,
			dmiNotes: func(string) []string { return nil },
		},
		{
			machine: "dup-uuid-board",
			facts:   wire.Facts{Vendor: "ASRock", Hostname: testHostname},
			sources: func(root string) map[string]string {
				return map[string]string{
					FactVendor:   dmiPath(root, "sys_vendor") + " (ghw)",
					FactHostname: "Config.Hostname",
				}
			},
			dmiNotes: func(string) []string {
				return []string{
					`product UUID "03000200-0400-0500-0006-000700080009" is a template UUID many boards ship, not an identity`,
					`product serial "To Be Filled By O.E.M." is a firmware placeholder, not an identity`,
					`board serial "Default string" is a firmware placeholder, not an identity`,
					`product name "To Be Filled By O.E.M." is a firmware placeholder, not a real value`,
				}
			},
		},
		{
			machine: "qemu-q35",
			facts: wire.Facts{
				ProductUUID: "5F0C4A2E-9B1D-4C73-8E6A-2D4F1B7C9A30",
				Vendor:      "QEMU",
				ProductName: "Standard PC (Q35 + ICH9, 2009)",
				Hostname:    testHostname,
			},
			sources: func(root string) map[string]string {
				return map[string]string{
					FactProductUUID: dmiPath(root, "product_uuid") + " (ghw)",
					FactVendor:      dmiPath(root, "sys_vendor") + " (ghw)",
					FactProductName: dmiPath(root, "product_name") + " (ghw)",
					FactHostname:    "Config.Hostname",
				}
			},
			dmiNotes: func(root string) []string {
				return []string{
					`product serial "" is empty, not an identity`,
					"no board serial: " + dmiPath(root, "board_serial") + " does not exist",
				}
			},
		},
		{
			machine: "jetson-orin",
			facts: wire.Facts{
				Serial:      "1423022012345",
				Vendor:      "nvidia",
				ProductName: "NVIDIA Jetson AGX Orin Developer Kit",
				Hostname:    testHostname,
			},
			sources: func(root string) map[string]string {
				dt := filepath.Join(root, "sys", "firmware", "devicetree", "base")
				return map[string]string{
					FactSerial:      filepath.Join(dt, "serial-number") + " (ghw, device tree)",
					FactVendor:      filepath.Join(dt, "compatible") + " (ghw, device tree)",
					FactProductName: filepath.Join(dt, "model") + " (ghw, device tree)",
					FactHostname:    "Config.Hostname",
				}
			},
			dmiNotes: func(root string) []string {
				dmi := filepath.Join(root, "sys", "class", "dmi", "id")
				return []string{
					"no product UUID: " + dmi + " does not exist and the device tree has none",
					"no board serial: " + dmi + " does not exist and the device tree has none",
				}
			},
		},
		{
			machine: "",
			facts:   wire.Facts{Hostname: testHostname},
			sources: func(string) map[string]string {
				return map[string]string{FactHostname: "Config.Hostname"}
			},
			dmiNotes: func(root string) []string {
				return []string{"no SMBIOS data: " + filepath.Join(root, "sys", "class", "dmi", "id") +
					" does not exist, so no product UUID, serials, vendor or product name"}
			},
		},
	}
	for _, tt := range tests {
		name := tt.machine
		if name == "" {
			name = "empty-root"
		}
		t.Run(name, func(t *testing.T) {
			root := t.TempDir()
			if tt.machine != "" {
				root = copyMachine(t, tt.machine, root)
			}
			got, err := Collect(context.Background(), Config{
				Root:          root,
				NetlinkHandle: h,
				GPUs:          noGPUs,
				Hostname:      testHostname,
			})
			if err != nil {
				t.Fatalf("Collect: %v", err)
			}
			if !reflect.DeepEqual(got.Facts, tt.facts) {
				t.Errorf("facts:\n got %+v\nwant %+v", got.Facts, tt.facts)
			}
			if want := tt.sources(root); !reflect.DeepEqual(got.Sources, want) {
				t.Errorf("sources:\n got %q\nwant %q", got.Sources, want)
			}
			wantNotes := append(append(tt.dmiNotes(root), emptyNetnsNotes...), noGPUsNote)
			if !reflect.DeepEqual(got.Notes, wantNotes) {
				t.Errorf("notes:\n got %q\nwant %q", got.Notes, wantNotes)
			}
		})
	}
}

// TestCollectPrintsNothing proves ghw's warnings (one per unreadable DMI
// file, on stderr by default) never reach stdout or stderr.
func TestCollectPrintsNothing(t *testing.T) {
	// ghw reads these on every call; they must not silence the control.
	for _, env := range []string{"GHW_DISABLE_WARNINGS", "GHW_LOG_LEVEL", "GHW_CHROOT"} {
		t.Setenv(env, "")
		os.Unsetenv(env)
	}
	h := newTestNetns(t)
	qemu := copyMachine(t, "qemu-q35", t.TempDir())

	// Control: plain ghw on a machine without board_* files warns on
	// stderr, and the capture sees it.
	control := captureOutput(t, func() {
		if _, err := ghw.Baseboard(ghw.WithChroot(qemu)); err != nil {
			t.Errorf("ghw.Baseboard: %v", err)
		}
	})
	if !strings.Contains(control, "Unable to read board_serial") {
		t.Fatalf("control: plain ghw printed %q, want its board_serial warning: the capture does not work", control)
	}

	for _, root := range []string{qemu, t.TempDir(), copyMachine(t, "jetson-orin", t.TempDir())} {
		var err error
		out := captureOutput(t, func() {
			_, err = Collect(context.Background(), Config{Root: root, NetlinkHandle: h, GPUs: noGPUs})
		})
		if err != nil {
			t.Fatalf("Collect(%s): %v", root, err)
		}
		if out != "" {
			t.Errorf("Collect(%s) printed %q, want nothing", root, out)
		}
	}
}

func TestCollectCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := Collect(ctx, Config{Root: t.TempDir(), GPUs: noGPUs})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Collect with a cancelled context: err = %v, want context.Canceled", err)
	}
}

func TestCollectHostname(t *testing.T) {
	want, err := os.Hostname()
	if err != nil {
		t.Fatalf("os.Hostname: %v", err)
	}
	got, err := Collect(context.Background(), Config{Root: t.TempDir(), NetlinkHandle: newTestNetns(t), GPUs: noGPUs})
	if err != nil {
		t.Fatalf("Collect: %v", err)
	}
	if got.Facts.Hostname != want || got.Sources[FactHostname] != "os.Hostname" {
		t.Errorf("hostname %q from %q, want %q from os.Hostname", got.Facts.Hostname, got.Sources[FactHostname], want)
	}
}

func TestReportJSON(t *testing.T) {
	r := Report{
		Facts: wire.Facts{
			ProductUUID: "4C4C4544-0037-5810-804A-B2C04F4B5133",
			MACs:        []string{"02:fc:00:00:00:01"},
		},
		Sources: map[string]string{FactProductUUID: "/sys/class/dmi/id/product_uuid (ghw)"},
		Notes:   []string{`board serial "Default string" is a firmware placeholder, not an identity`},
	}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatalf("marshal: %v", err)
	}
	want := `{"facts":{"productUuid":"4C4C4544-0037-5810-804A-B2C04F4B5133","macs":["02:fc:00:00:00:01"]},` +
		`"sources":{"productUuid":"/sys/class/dmi/id/product_uuid (ghw)"},` +
		`"notes":["board serial \"Default string\" is a firmware placeholder, not an identity"]}`
	if string(b) != want {
		t.Errorf("json:\n got %s\nwant %s", b, want)
	}
	var back Report
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatalf("unmarshal: %v", err)
	}
	if !reflect.DeepEqual(back, r) {
		t.Errorf("round trip: got %+v, want %+v", back, r)
	}
}

func TestCollectEmptyReportJSON(t *testing.T) {
	// Even with nothing found the shape stays the same: empty object and
	// arrays, never null, so scripts can index without checks.
	got, err := Collect(context.Background(), Config{Root: t.TempDir(), NetlinkHandle: newTestNetns(t), GPUs: fakeGPUs{}, Hostname: "h"})
	if err != nil {
		t.Fatalf("Collect: %v", err)
	}
	got.Notes = got.Notes[:0]
	b, err := json.Marshal(got)
	if err != nil {
		t.Fatalf("marshal: %v", err)
	}
	if want := `{"facts":{"hostname":"h"},"sources":{"hostname":"Config.Hostname"},"notes":[]}`; string(b) != want {
		t.Errorf("json: got %s, want %s", b, want)
	}
}

func TestReportText(t *testing.T) {
	r := Report{
		Facts: wire.Facts{
			ProductUUID: "4C4C4544-0037-5810-804A-B2C04F4B5133",
			Serial:      "7XJ2KQ3",
			MACs:        []string{"02:fc:00:00:00:01", "3c:ec:ef:a1:b2:c3"},
			Hostname:    "r760-01",
		},
		Sources: map[string]string{
			FactProductUUID: "/sys/class/dmi/id/product_uuid (ghw)",
			FactSerial:      "/sys/class/dmi/id/product_serial (ghw)",
			FactMACs:        "netlink: 02:fc:00:00:00:01 on eth0 (bus virtio, permanent address); 3c:ec:ef:a1:b2:c3 on eno1 (bus pci, permanent address)",
			FactHostname:    "os.Hostname",
		},
		Notes: []string{`board serial "Default string" is a firmware placeholder, not an identity`},
	}
	want := `Hardware identity this machine claims (self-reported, not attested)

  product UUID  4C4C4544-0037-5810-804A-B2C04F4B5133
                from /sys/class/dmi/id/product_uuid (ghw)
  serial        7XJ2KQ3
                from /sys/class/dmi/id/product_serial (ghw)
  board serial  (none)
  vendor        (none)
  product name  (none)
  MACs          02:fc:00:00:00:01
                3c:ec:ef:a1:b2:c3
                from netlink: 02:fc:00:00:00:01 on eth0 (bus virtio, permanent address); 3c:ec:ef:a1:b2:c3 on eno1 (bus pci, permanent address)
  GPU UUIDs     (none)
  hostname      r760-01
                from os.Hostname

Notes:
  - board serial "Default string" is a firmware placeholder, not an identity
`
	if got := r.Text(); got != want {
		t.Errorf("text:\n%s\nwant:\n%s", got, want)
	}
}

// TestCollectDMIOddFiles covers firmware values that are present but
// unusable, and files that exist but cannot be read.
func TestCollectDMIOddFiles(t *testing.T) {
	tests := []struct {
		name      string
		file      string // under sys/class/dmi/id
		content   string // "" with dir set: a directory instead of a file
		dir       bool
		wantFacts wire.Facts
		wantNote  func(root string) string
	}{
		{
			name: "uuid not settable", file: "product_uuid", content: "Not Settable\n",
			wantNote: func(string) string { return `product UUID "NOT SETTABLE" is a firmware placeholder, not an identity` },
		},
		{
			name: "uuid too short", file: "product_uuid", content: "4c4c4544-0037\n",
			wantNote: func(string) string { return `product UUID "4C4C4544-0037" is not a UUID, not an identity` },
		},
		{
			name: "uuid all F", file: "product_uuid", content: "ffffffff-ffff-ffff-ffff-ffffffffffff\n",
			wantNote: func(string) string {
				return `product UUID "FFFFFFFF-FFFF-FFFF-FFFF-FFFFFFFFFFFF" is all F, not an identity`
			},
		},
		{
			name: "serial literally unknown", file: "product_serial", content: "Unknown\n",
			wantNote: func(string) string { return `product serial "Unknown" is a firmware placeholder, not an identity` },
		},
		{
			name: "lower-case unknown from firmware", file: "product_serial", content: "unknown\n",
			wantNote: func(string) string { return `product serial "unknown" is a firmware placeholder, not an identity` },
		},
		{
			name: "serial unreadable", file: "product_serial", dir: true,
			wantNote: func(root string) string {
				return "no product serial: read " + dmiPath(root, "product_serial") + ": is a directory"
			},
		},
		{
			name: "vendor placeholder", file: "sys_vendor", content: "System manufacturer\n",
			wantNote: func(string) string { return `vendor "System manufacturer" is a firmware placeholder, not a real value` },
		},
		{
			name: "serial with padding", file: "product_serial", content: "  7XJ2KQ3  \n",
			wantFacts: wire.Facts{Serial: "7XJ2KQ3"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			dir := filepath.Join(root, "sys", "class", "dmi", "id")
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(dir, tt.file)
			var err error
			if tt.dir {
				err = os.Mkdir(path, 0o755)
			} else {
				err = os.WriteFile(path, []byte(tt.content), 0o400)
			}
			if err != nil {
				t.Fatal(err)
			}
			r := Report{Sources: map[string]string{}}
			collectDMI(context.Background(), root, &r, discardLogger())
			if !reflect.DeepEqual(r.Facts, tt.wantFacts) {
				t.Errorf("facts = %+v, want %+v", r.Facts, tt.wantFacts)
			}
			if tt.wantNote == nil {
				for _, f := range dmiFields {
					if f.dmiFile != tt.file {
						continue
					}
					for _, n := range r.Notes {
						if strings.HasPrefix(n, f.label) || strings.HasPrefix(n, "no "+f.label) {
							t.Errorf("unexpected note %q", n)
						}
					}
				}
				return
			}
			if want := tt.wantNote(root); !slices.Contains(r.Notes, want) {
				t.Errorf("notes:\n%q\nlack\n%q", r.Notes, want)
			}
		})
	}
}

// TestCollectLogsGhwAtDebug checks ghw's messages reach the injected logger,
// demoted to debug, and nowhere else.
func TestCollectLogsGhwAtDebug(t *testing.T) {
	root := copyMachine(t, "qemu-q35", t.TempDir())
	h := newTestNetns(t)
	for _, level := range []slog.Level{slog.LevelDebug, slog.LevelInfo} {
		var buf bytes.Buffer
		logger := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: level}))
		if _, err := Collect(context.Background(), Config{Root: root, NetlinkHandle: h, GPUs: noGPUs, Logger: logger}); err != nil {
			t.Fatalf("Collect: %v", err)
		}
		logged := strings.Contains(buf.String(), "level=DEBUG msg=\"Unable to read board_serial")
		if want := level == slog.LevelDebug; logged != want || strings.Contains(buf.String(), "level=WARN") {
			t.Errorf("logger at %v: ghw's board_serial message at debug = %v, want %v; log:\n%s", level, logged, want, buf.String())
		}
		if level == slog.LevelDebug && !strings.Contains(buf.String(), "probe=ghw") {
			t.Errorf("ghw's records lack probe=ghw:\n%s", buf.String())
		}
	}
}
