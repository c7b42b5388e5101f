package procmem

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestMappedKiB: a mapped file counts only once its pages are touched, and
// only its own mapping counts.
func TestMappedKiB(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "mapped")
	const size = 1 << 20
	if err := os.WriteFile(path, make([]byte, size), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := syscall.Mmap(int(f.Fd()), 0, size, syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(m)
	if err := syscall.Madvise(m, syscall.MADV_RANDOM); err != nil {
		t.Fatal(err)
	}
	untouched, err := MappedKiB(os.Getpid(), path)
	if err != nil {
		t.Fatal(err)
	}
	var sum byte
	for i := 0; i < size; i += 4096 {
		sum += m[i]
	}
	touched, err := MappedKiB(os.Getpid(), path)
	if err != nil {
		t.Fatal(err)
	}
	other, err := MappedKiB(os.Getpid(), filepath.Join(dir, "other"))
	if err != nil {
		t.Fatal(err)
	}
	if untouched != 0 || touched != size/1024 || other != 0 {
		t.Fatalf("resident KiB: %d untouched, %d touched (want %d), %d of another path (sum %d)", untouched, touched, size/1024, other, sum)
	}
}

// TestReadStatus: this process's own status holds resident memory, the
// parts add up to at most the whole, and the peak is at least now.
func TestReadStatus(t *testing.T) {
	st, err := ReadStatus(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if st.RSS <= 0 || st.Anon <= 0 || st.File <= 0 || st.HWM < st.RSS || st.Anon+st.File > st.RSS {
		t.Fatalf("status %+v", st)
	}
	if _, err := ReadStatus(-1); err == nil {
		t.Fatal("status of pid -1 read")
	}
}
