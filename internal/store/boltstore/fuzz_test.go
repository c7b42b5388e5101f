package boltstore_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stratumjoin/stratum/internal/store/boltstore"
)

// FuzzOpen: whatever bytes a state file (or a backup given to `store
// restore`) holds, Open answers an error or a store, never a panic.
func FuzzOpen(f *testing.F) {
	dir := f.TempDir()
	good := filepath.Join(dir, "good.db")
	s, err := boltstore.Open(good, boltstore.Options{})
	if err != nil {
		f.Fatal(err)
	}
	s.Close()
	raw, err := os.ReadFile(good)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(raw)
	f.Add(raw[:len(raw)/3])
	f.Add([]byte{})
	flipped := append([]byte(nil), raw...)
	for i := 4096 * 2; i < len(flipped); i += 11 {
		flipped[i] ^= 0x5a
	}
	f.Add(flipped)
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(t.TempDir(), "state.db")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		if s, err := boltstore.Open(path, boltstore.Options{}); err == nil {
			s.Close()
		}
	})
}
