package hwid

import (
	"context"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/stratumjoin/stratum/internal/testenv"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// sysfsTestdata holds one fake machine root per directory.
const sysfsTestdata = "../testdata/sysfs"

// rootOnlyDMI are the DMI files the kernel creates 0400; the rest are 0444.
var rootOnlyDMI = map[string]bool{
	"product_uuid":   true,
	"product_serial": true,
	"board_serial":   true,
	"chassis_serial": true,
}

// copyMachine copies testdata/sysfs/<machine> below dir with the modes the
// kernel gives those files (git keeps neither 0400 nor 0444) and returns the
// copy's root. Directories are 0755 so another user can walk the tree and
// meet the file modes.
func copyMachine(t *testing.T, machine, dir string) string {
	t.Helper()
	src := filepath.Join(sysfsTestdata, machine)
	dst := filepath.Join(dir, machine)
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		mode := fs.FileMode(0o444)
		if rootOnlyDMI[d.Name()] {
			mode = 0o400
		}
		if err := os.WriteFile(target, data, 0o600); err != nil {
			return err
		}
		return os.Chmod(target, mode)
	})
	if err != nil {
		t.Fatalf("copy %s: %v", machine, err)
	}
	return dst
}

// newTestNetns makes a fresh network namespace (holding only lo) and
// returns a netlink handle on it; both go away at the end of the test.
func newTestNetns(t *testing.T) *netlink.Handle {
	t.Helper()
	testenv.NeedRoot(t, "make a network namespace")
	// netns.New moves the calling thread into the new namespace: do it on a
	// locked thread and move back before anything else runs there.
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatalf("current netns: %v", err)
	}
	defer orig.Close()
	ns, err := netns.New()
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatalf("new netns: %v", err)
	}
	if err := netns.Set(orig); err != nil {
		// The thread stays locked, so it dies with this goroutine
		// instead of carrying the wrong namespace into the scheduler.
		ns.Close()
		t.Fatalf("back to the original netns: %v", err)
	}
	runtime.UnlockOSThread()

	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		ns.Close()
		t.Fatalf("netlink handle in new netns: %v", err)
	}
	t.Cleanup(func() {
		h.Close()
		ns.Close()
	})
	return h
}

// fakeGPUs is a GPUProber that returns a fixed result.
type fakeGPUs GPUResult

func (f fakeGPUs) ProbeGPUs(context.Context) GPUResult { return GPUResult(f) }

// noGPUsNote is what the fake without GPUs says.
const noGPUsNote = "no GPU UUIDs: fake prober"

var noGPUs = fakeGPUs{Notes: []string{noGPUsNote}}

// captureOutput runs fn with file descriptors 1 and 2 pointing into a pipe
// and returns what was written to them. It works on descriptors, not on the
// os.Stdout/os.Stderr variables, because ghw's default logger kept its own
// copy of os.Stderr when the package was initialised. Not for parallel
// tests: it captures the whole process.
func captureOutput(t *testing.T, fn func()) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatalf("pipe: %v", err)
	}
	defer r.Close()
	saved := map[int]int{}
	for _, fd := range []int{1, 2} {
		dup, err := unix.Dup(fd)
		if err != nil {
			t.Fatalf("dup %d: %v", fd, err)
		}
		saved[fd] = dup
	}
	done := make(chan []byte)
	go func() {
		b, _ := io.ReadAll(r)
		done <- b
	}()
	restore := func() {
		for fd, dup := range saved {
			if err := unix.Dup2(dup, fd); err != nil {
				panic("restore fd: " + err.Error())
			}
			unix.Close(dup)
		}
	}
	for fd := range saved {
		if err := unix.Dup2(int(w.Fd()), fd); err != nil {
			restore()
			t.Fatalf("redirect fd %d: %v", fd, err)
		}
	}
	func() {
		defer restore()
		fn()
	}()
	w.Close()
	return string(<-done)
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
