package systemd

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/coreos/go-systemd/v22/unit"

	"github.com/stratumjoin/stratum/internal/testenv"
)

var unitNames = []string{
	"stratum-agent.service",
	"stratum-listener-admin.socket",
	"stratum-listener.service",
	"stratum-listener.socket",
}

// requireTool fails when a systemd tool is missing (skips only under
// -short): the unit checks are the proof the units load, and CI installs
// the package.
func requireTool(t *testing.T, name string) string {
	t.Helper()
	return testenv.NeedTool(t, name, "systemd")
}

// newRoot builds a file system root for `systemd-analyze --root=`: the units
// under etc/systemd/system and executable stubs for the ExecStart binaries,
// because verify refuses a unit whose binary does not exist.
func newRoot(t *testing.T, units map[string][]byte) string {
	t.Helper()
	root := t.TempDir()
	unitDir := filepath.Join(root, "etc", "systemd", "system")
	binDir := filepath.Join(root, "usr", "local", "bin")
	for _, d := range []string{unitDir, binDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for name, content := range units {
		if err := os.WriteFile(filepath.Join(unitDir, name), content, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, bin := range []string{"stratum-agent", "stratum-listener"} {
		if err := os.WriteFile(filepath.Join(binDir, bin), []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// ExecStartPost= of the agent removes the join code with /bin/rm
	if err := os.MkdirAll(filepath.Join(root, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "bin", "rm"), []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return root
}

// verifyUnit runs `systemd-analyze verify` the strict way: without
// --recursive-errors an unknown key is only a warning and rc stays 0, so any
// stderr output counts as a failure too.
func verifyUnit(t *testing.T, root, name string) error {
	t.Helper()
	analyze := requireTool(t, "systemd-analyze")
	cmd := exec.Command(analyze, "verify", "--recursive-errors=no", "--man=no", "--root="+root, name)
	var stderr bytes.Buffer
	cmd.Stdout = &stderr // verify has nothing to say on stdout either when all is well
	cmd.Stderr = &stderr
	err := cmd.Run()
	var exitErr *exec.ExitError
	if err != nil && !errors.As(err, &exitErr) {
		t.Fatalf("running systemd-analyze: %v", err)
	}
	if err != nil || stderr.Len() > 0 {
		return fmt.Errorf("systemd-analyze verify %s: %v\n%s", name, err, stderr.String())
	}
	return nil
}

func TestUnitsPassVerify(t *testing.T) {
	root := newRoot(t, UnitFiles())
	for _, name := range unitNames {
		t.Run(name, func(t *testing.T) {
			if err := verifyUnit(t, root, name); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestVerifyCatchesMistakes proves the check above can fail: each broken
// copy of a unit must be refused.
func TestVerifyCatchesMistakes(t *testing.T) {
	tests := []struct {
		name      string
		unit      string
		old, new  string
		removeBin string
	}{
		{name: "typo in key", unit: "stratum-agent.service", old: "WatchdogSec=60s", new: "WatchdogSecc=60s"},
		{name: "bad Restart value", unit: "stratum-agent.service", old: "Restart=on-failure", new: "Restart=sometimes"},
		{name: "bad Type", unit: "stratum-listener.service", old: "Type=notify", new: "Type=notifyy"},
		{name: "typo in socket key", unit: "stratum-listener.socket", old: "FileDescriptorName=quic", new: "FileDescriptorNam=quic"},
		{name: "missing binary", unit: "stratum-agent.service", removeBin: "stratum-agent"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			units := UnitFiles()
			if tt.old != "" {
				if !bytes.Contains(units[tt.unit], []byte(tt.old)) {
					t.Fatalf("%s does not contain %q; update the test", tt.unit, tt.old)
				}
				units[tt.unit] = bytes.Replace(units[tt.unit], []byte(tt.old), []byte(tt.new), 1)
			}
			root := newRoot(t, units)
			if tt.removeBin != "" {
				if err := os.Remove(filepath.Join(root, "usr", "local", "bin", tt.removeBin)); err != nil {
					t.Fatal(err)
				}
			}
			err := verifyUnit(t, root, tt.unit)
			if err == nil {
				t.Fatalf("verify accepted a broken %s", tt.unit)
			}
			t.Logf("refused as expected: %v", err)
		})
	}
}

var exposureRE = regexp.MustCompile(`Overall exposure level for \S+: ([0-9]+\.[0-9]+)`)

// TestSecurityExposure keeps the sandboxing from eroding. Figures measured
// with systemd 252: agent 1.7, listener 1.2 (0 is best, 10 worst; the agent
// pays for shared /dev (NVML), CAP_DAC_READ_SEARCH (DMI) and netlink). The
// limits leave a little room for other systemd versions' weights.
func TestSecurityExposure(t *testing.T) {
	analyze := requireTool(t, "systemd-analyze")
	root := newRoot(t, UnitFiles())
	tests := []struct {
		unit string
		max  float64
	}{
		{"stratum-agent.service", 2.5},
		{"stratum-listener.service", 2.0},
	}
	for _, tt := range tests {
		t.Run(tt.unit, func(t *testing.T) {
			out, err := exec.Command(analyze, "security", "--offline=yes", "--root="+root, "--no-pager", tt.unit).CombinedOutput()
			if err != nil {
				t.Fatalf("systemd-analyze security: %v\n%s", err, out)
			}
			m := exposureRE.FindSubmatch(out)
			if m == nil {
				t.Fatalf("no overall exposure in output:\n%s", out)
			}
			score, err := strconv.ParseFloat(string(m[1]), 64)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: overall exposure %.1f (limit %.1f)", tt.unit, score, tt.max)
			if score > tt.max {
				t.Errorf("%s exposure %.1f is over %.1f:\n%s", tt.unit, score, tt.max, out)
			}
		})
	}
}

// TestUnitContract checks the settings other parts of Stratum Join rely on:
// the command lines of docs/architecture.md#parts, the exit statuses that must not
// restart, the credential name the agent reads, and the socket names the
// listener looks up.
func TestUnitContract(t *testing.T) {
	units := UnitFiles()
	tests := []struct {
		unit, section, key string
		want               []string
	}{
		{"stratum-agent.service", "Service", "Type", []string{"notify"}},
		{"stratum-agent.service", "Service", "ExecStart", []string{"/usr/local/bin/stratum-agent run --state /var/lib/stratum-agent"}},
		{"stratum-agent.service", "Service", "StateDirectory", []string{"stratum-agent"}},
		{"stratum-agent.service", "Service", "StateDirectoryMode", []string{"0700"}},
		{"stratum-agent.service", "Service", "LoadCredential", []string{"join-code:/etc/stratum/join-code"}},
		{"stratum-agent.service", "Service", "SetCredential", []string{`join-code:\n`}},
		{"stratum-agent.service", "Service", "ExecStartPost", []string{"+/bin/rm -f /etc/stratum/join-code"}},
		{"stratum-agent.service", "Service", "TimeoutStartSec", []string{"infinity"}},
		{"stratum-agent.service", "Service", "DynamicUser", []string{"yes"}},
		{"stratum-agent.service", "Service", "CapabilityBoundingSet", []string{"CAP_DAC_READ_SEARCH"}},
		{"stratum-agent.service", "Service", "AmbientCapabilities", []string{"CAP_DAC_READ_SEARCH"}},
		{"stratum-agent.service", "Service", "Restart", []string{"on-failure"}},
		{"stratum-agent.service", "Service", "RestartPreventExitStatus", []string{"1 2"}},
		{"stratum-agent.service", "Service", "WatchdogSec", []string{"60s"}},
		{"stratum-agent.service", "Unit", "After", []string{"network-online.target", "sysinit.target basic.target"}},
		{"stratum-agent.service", "Unit", "Wants", []string{"network-online.target"}},
		{"stratum-agent.service", "Install", "WantedBy", []string{"multi-user.target"}},
		// multi-user.target must not be ordered after an agent waiting to join
		{"stratum-agent.service", "Unit", "DefaultDependencies", []string{"no"}},
		{"stratum-agent.service", "Unit", "Before", []string{"shutdown.target"}},
		{"stratum-agent.service", "Unit", "Conflicts", []string{"shutdown.target"}},
		// a panic or the watchdog's SIGABRT dies by signal, and is restarted
		{"stratum-agent.service", "Service", "Environment", []string{"GOTRACEBACK=crash"}},
		{"stratum-agent.service", "Service", "EnvironmentFile", []string{"-/etc/stratum/agent.env"}},
		{"stratum-listener.service", "Service", "Environment", []string{"GOTRACEBACK=crash"}},
		{"stratum-listener.service", "Service", "EnvironmentFile", []string{"-/etc/stratum/listener.env"}},
		{"stratum-listener.service", "Service", "Restart", []string{"on-failure"}},
		{"stratum-listener.service", "Service", "RestartPreventExitStatus", []string{"2"}},
		{"stratum-listener.service", "Service", "Type", []string{"notify"}},
		{"stratum-listener.service", "Service", "ExecStart", []string{"/usr/local/bin/stratum-listener serve --data /var/lib/stratum-listener --admin-socket /run/stratum/admin.sock"}},
		{"stratum-listener.service", "Service", "StateDirectoryMode", []string{"0700"}},
		{"stratum-listener.service", "Service", "Sockets", []string{"stratum-listener.socket stratum-listener-admin.socket"}},
		{"stratum-listener.service", "Service", "CapabilityBoundingSet", []string{""}},
		{"stratum-listener.service", "Service", "DynamicUser", []string{"yes"}},
		{"stratum-agent.service", "Service", "LimitCORE", []string{"0"}},
		{"stratum-listener.service", "Service", "LimitCORE", []string{"0"}},
		{"stratum-listener.service", "Unit", "Requires", []string{"stratum-listener.socket stratum-listener-admin.socket"}},
		{"stratum-listener.socket", "Socket", "ListenDatagram", []string{"9444"}},
		{"stratum-listener.socket", "Socket", "BindIPv6Only", []string{"both"}},
		{"stratum-listener.socket", "Socket", "FileDescriptorName", []string{QUICSocketName}},
		{"stratum-listener.socket", "Socket", "Service", []string{"stratum-listener.service"}},
		{"stratum-listener.socket", "Socket", "ReceiveBuffer", []string{"7M"}},
		{"stratum-listener.socket", "Install", "WantedBy", []string{"sockets.target"}},
		{"stratum-listener-admin.socket", "Socket", "ListenStream", []string{"/run/stratum/admin.sock"}},
		{"stratum-listener-admin.socket", "Socket", "FileDescriptorName", []string{AdminSocketName}},
		{"stratum-listener-admin.socket", "Socket", "SocketMode", []string{"0600"}},
		{"stratum-listener-admin.socket", "Socket", "DirectoryMode", []string{"0700"}},
		{"stratum-listener-admin.socket", "Socket", "Service", []string{"stratum-listener.service"}},
		{"stratum-listener-admin.socket", "Install", "WantedBy", []string{"sockets.target"}},
	}
	parsed := map[string][]*unit.UnitOption{}
	for name, content := range units {
		opts, err := unit.DeserializeOptions(bytes.NewReader(content))
		if err != nil {
			t.Fatalf("parse %s: %v", name, err)
		}
		parsed[name] = opts
	}
	for _, tt := range tests {
		t.Run(tt.unit+"/"+tt.key, func(t *testing.T) {
			var got []string
			for _, o := range parsed[tt.unit] {
				if o.Section == tt.section && o.Name == tt.key {
					got = append(got, o.Value)
				}
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("[%s] %s= in %s: got %q, want %q", tt.section, tt.key, tt.unit, got, tt.want)
			}
		})
	}
	// Each socket unit carries exactly one Listen line: FileDescriptorName=
	// would otherwise give its name to several sockets.
	for _, name := range []string{"stratum-listener.socket", "stratum-listener-admin.socket"} {
		n := 0
		for _, o := range parsed[name] {
			if o.Section == "Socket" && strings.HasPrefix(o.Name, "Listen") {
				n++
			}
		}
		if n != 1 {
			t.Errorf("%s has %d Listen lines, want 1", name, n)
		}
	}
}

func TestUnitFiles(t *testing.T) {
	got := UnitFiles()
	names := make([]string, 0, len(got))
	for name := range got {
		names = append(names, name)
	}
	slices.Sort(names)
	if !slices.Equal(names, unitNames) {
		t.Fatalf("UnitFiles() names = %q, want %q", names, unitNames)
	}
	// Every unit file in the package directory must be embedded, or
	// `make install` would silently leave it out.
	for _, pattern := range []string{"*.service", "*.socket", "*.timer", "*.path", "*.target"} {
		onDisk, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range onDisk {
			disk, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got[f], disk) {
				t.Errorf("%s on disk is not the embedded copy (missing from the go:embed line?)", f)
			}
		}
	}
	// The returned bytes are the caller's: changing them changes nothing
	// for the next caller.
	got["stratum-agent.service"][0] ^= 0xff
	delete(got, "stratum-listener.socket")
	again := UnitFiles()
	if again["stratum-agent.service"][0] == got["stratum-agent.service"][0] || again["stratum-listener.socket"] == nil {
		t.Error("UnitFiles returned shared state")
	}
}

func TestInstall(t *testing.T) {
	dest := t.TempDir()
	dir := filepath.Join(dest, "lib", "systemd", "system")
	// A stale, differently-moded copy is replaced.
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "stratum-agent.service"), []byte("stale"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Install(dest); err != nil {
		t.Fatal(err)
	}
	want := UnitFiles()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != len(want) {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Errorf("%s holds %q, want exactly the %d units (no temp files)", dir, names, len(want))
	}
	for name, content := range want {
		path := filepath.Join(dir, name)
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, content) {
			t.Errorf("%s: installed bytes differ from embedded", name)
		}
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o644 {
			t.Errorf("%s: mode %o, want 644", name, fi.Mode().Perm())
		}
	}
	// What was installed is what the verify test checked: it loads.
	root := newRoot(t, nil)
	for name := range want {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, "etc", "systemd", "system", name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := verifyUnit(t, root, "stratum-listener.service"); err != nil {
		t.Error(err)
	}
}

func TestInstallRefusesEmptyDestination(t *testing.T) {
	t.Chdir(t.TempDir())
	if err := Install(""); err == nil {
		t.Fatal("Install(\"\") succeeded")
	}
	if _, err := os.Stat("lib"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Install(\"\") wrote into the current directory: %v", err)
	}
}
