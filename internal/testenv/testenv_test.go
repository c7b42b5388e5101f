package testenv

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestFreePortsAreHandedOnce: no two calls in a process get the same port,
// though each is free again by the time the next call looks.
func TestFreePortsAreHandedOnce(t *testing.T) {
	seen := map[string]bool{}
	for range 300 {
		addr := FreeTCP(t)
		if seen[addr] {
			t.Fatalf("%s handed out twice", addr)
		}
		seen[addr] = true
	}
}

// TestReserveSkipsAPortAnotherProcessHolds: a port whose lock file another
// open file holds (as another test process's would) is not claimed, and
// once that lock goes it is; a claimed port is not claimed again.
func TestReserveSkipsAPortAnotherProcessHolds(t *testing.T) {
	const port = 31999
	if err := os.MkdirAll(portLocks, 0o700); err != nil {
		t.Fatal(err)
	}
	other, err := os.OpenFile(filepath.Join(portLocks, "test-31999"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(other.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	if reserve("test", port) {
		t.Fatal("claimed a port another process holds")
	}
	other.Close()
	if !reserve("test", port) {
		t.Fatal("did not claim a port nobody holds")
	}
	if reserve("test", port) {
		t.Fatal("claimed a port twice")
	}
}
