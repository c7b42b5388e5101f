package boltstore_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stratumjoin/stratum/internal/store"
	"github.com/stratumjoin/stratum/internal/store/boltstore"
)

// filled makes a store file with n keys and closes it.
func filled(t *testing.T, n int) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := boltstore.Open(path, boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		ops := []store.Op{{Key: fmt.Sprintf("secret/%04d", i), Value: []byte(strings.Repeat("v", 200))}}
		if _, err := s.Txn(context.Background(), nil, ops); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// corruptLeaves overwrites the element headers of every leaf page of the
// file with offsets far outside the page, as flipped bits would.
func corruptLeaves(t *testing.T, path string) int {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	const ps = 4096
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n := 0
	for off := 2 * ps; off+ps <= len(raw); off += ps {
		flags := binary.LittleEndian.Uint16(raw[off+8:])
		count := binary.LittleEndian.Uint16(raw[off+10:])
		if flags != 0x02 || count == 0 { // leaf pages only
			continue
		}
		bad := make([]byte, 16*int(count))
		for i := range int(count) {
			binary.LittleEndian.PutUint32(bad[16*i+4:], 0x7fff0000) // pos
			binary.LittleEndian.PutUint32(bad[16*i+8:], 0x7fff)     // ksize
		}
		if _, err := f.WriteAt(bad, int64(off+16)); err != nil {
			t.Fatal(err)
		}
		n++
	}
	if n == 0 {
		t.Fatal("no leaf page found to corrupt")
	}
	return n
}

// TestRefusesDamagedFiles: an empty, a short, a truncated and a
// bit-flipped file are refused at Open with ErrCorrupt, a message naming
// the file and the recovery, and no panic.
func TestRefusesDamagedFiles(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, path string)
		want   string
	}{
		{"zero length", func(t *testing.T, path string) { os.Truncate(path, 0) }, "is empty (0 bytes)"},
		{"short", func(t *testing.T, path string) { os.Truncate(path, 1000) }, "shorter than any bbolt file"},
		{"truncated to a third", func(t *testing.T, path string) {
			fi, _ := os.Stat(path)
			os.Truncate(path, fi.Size()/3)
		}, "it was truncated"},
		{"meta pages flipped", func(t *testing.T, path string) {
			f, _ := os.OpenFile(path, os.O_WRONLY, 0)
			f.WriteAt([]byte{0xff, 0xff, 0xff, 0xff}, 16)
			f.WriteAt([]byte{0xff, 0xff, 0xff, 0xff}, 4096+16)
			f.Close()
		}, "no valid meta page"},
		{"data pages flipped", func(t *testing.T, path string) { corruptLeaves(t, path) }, "consistency check"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filled(t, 300)
			tc.damage(t, path)
			s, err := boltstore.Open(path, boltstore.Options{})
			if err == nil {
				s.Close()
				t.Fatal("a damaged file opened")
			}
			if !errors.Is(err, store.ErrCorrupt) {
				t.Errorf("err %v, want ErrCorrupt", err)
			}
			for _, want := range []string{path, tc.want, "store restore"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("message %q lacks %q", err, want)
				}
			}
		})
	}
}

// TestDamageWhileOpenIsAnError: pages damaged under an open store make
// reads and writes fail with ErrCorrupt, never a panic, and Healthy
// reports it from then on.
func TestDamageWhileOpenIsAnError(t *testing.T) {
	path := filled(t, 300)
	s, err := boltstore.Open(path, boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Healthy(); err != nil {
		t.Fatalf("healthy store: %v", err)
	}
	corruptLeaves(t, path)
	ctx := context.Background()
	_, gerr := s.Get(ctx, "secret/0150")
	_, lerr := s.List(ctx, "secret/", "", 0)
	_, terr := s.Txn(ctx, nil, []store.Op{{Key: "secret/0150", Value: []byte("x")}})
	for name, err := range map[string]error{"get": gerr, "list": lerr, "txn": terr} {
		if !errors.Is(err, store.ErrCorrupt) {
			t.Errorf("%s on damaged pages: err %v, want ErrCorrupt", name, err)
		}
	}
	if err := s.Healthy(); !errors.Is(err, store.ErrCorrupt) {
		t.Errorf("Healthy after damage: %v", err)
	}
}

// TestCheckReportsDamage: store check names a damaged file and passes a
// sound one.
func TestCheckReportsDamage(t *testing.T) {
	path := filled(t, 50)
	if err := boltstore.Check(path); err != nil {
		t.Fatalf("sound file: %v", err)
	}
	os.Truncate(path, 0)
	if err := boltstore.Check(path); !errors.Is(err, store.ErrCorrupt) {
		t.Fatalf("empty file: %v", err)
	}
}
