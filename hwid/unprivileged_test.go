package hwid

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"syscall"
	"testing"

	"github.com/stratumjoin/stratum/internal/testenv"
)

// unprivilegedRootEnv, when set, makes the test binary collect below that
// root, print the Report as JSON and exit: TestCollectUnprivileged runs it
// so as another user.
const unprivilegedRootEnv = "HWID_TEST_UNPRIVILEGED_ROOT"

func TestMain(m *testing.M) {
	if root := os.Getenv(unprivilegedRootEnv); root != "" {
		r, err := Collect(context.Background(), Config{Root: root, GPUs: noGPUs, Hostname: testHostname})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		if err := json.NewEncoder(os.Stdout).Encode(r); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestCollectUnprivileged runs Collect as nobody against a tree with the
// kernel's file modes: the root-only UUID and serials must come out as
// "not readable", the rest as usual, and nothing may fail.
func TestCollectUnprivileged(t *testing.T) {
	testenv.NeedRoot(t, "run the probe as nobody")
	// A directory nobody can enter, holding a copy of this test binary
	// (go test keeps the original in a root-only directory).
	dir, err := os.MkdirTemp("", "hwid-unprivileged-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "hwid.test")
	copyExecutable(t, bin)
	root := copyMachine(t, "dell-r760", dir)

	cmd := exec.Command(bin, "-test.run=^$")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), unprivilegedRootEnv+"="+root)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("collect as nobody: %v\n%s", err, stderr)
	}
	var got Report
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("child output %q: %v", out, err)
	}

	if f := got.Facts; f.Vendor != "Dell Inc." || f.ProductName != "PowerEdge R760" || f.Hostname != testHostname ||
		f.ProductUUID != "" || f.Serial != "" || f.BoardSerial != "" {
		t.Errorf("facts as nobody = %+v, want vendor, product name and hostname only (MACs aside)", f)
	}
	const why = " is not readable (the kernel makes it root-only: run as root or with CAP_DAC_READ_SEARCH)"
	want := []string{
		"no product UUID: " + dmiPath(root, "product_uuid") + why,
		"no product serial: " + dmiPath(root, "product_serial") + why,
		"no board serial: " + dmiPath(root, "board_serial") + why,
	}
	if len(got.Notes) < len(want) || !reflect.DeepEqual(got.Notes[:len(want)], want) {
		t.Errorf("notes as nobody:\n got %q\nwant first %q", got.Notes, want)
	}
}

func copyExecutable(t *testing.T, dst string) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.Open(exe)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, src); err != nil {
		out.Close()
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}
