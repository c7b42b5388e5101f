package boltstore_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/stratumjoin/stratum/internal/store"
	"github.com/stratumjoin/stratum/internal/store/boltstore"
	"github.com/stratumjoin/stratum/internal/store/storetest"
)

func openIn(t testing.TB, dir string) *boltstore.Store {
	t.Helper()
	s, err := boltstore.Open(filepath.Join(dir, "state.db"), boltstore.Options{})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return s
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return openIn(t, t.TempDir()) })
}

func TestReopen(t *testing.T) {
	storetest.RunReopen(t, func(t *testing.T, dir string) store.Store { return openIn(t, dir) })
}

func TestCreatesPrivateFileAndDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "var", "lib", "stratum")
	s := openIn(t, dir)
	defer s.Close()
	for path, want := range map[string]os.FileMode{dir: 0o700 | os.ModeDir, filepath.Join(dir, "state.db"): 0o600} {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode(); got != want {
			t.Errorf("%s mode = %v, want %v", path, got, want)
		}
	}
}

func TestRefusesFileOthersCanRead(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := boltstore.Open(path, boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	s, err = boltstore.Open(path, boltstore.Options{})
	if err == nil {
		s.Close()
		t.Fatal("Open accepted a state file with mode 0644")
	}
	if !strings.Contains(err.Error(), "0644") {
		t.Errorf("error does not name the mode: %v", err)
	}
}

func TestOpenTimesOutWhileAnotherOpenHoldsTheFile(t *testing.T) {
	dir := t.TempDir()
	first := openIn(t, dir)
	defer first.Close()

	const timeout = 200 * time.Millisecond
	start := time.Now()
	second, err := boltstore.Open(filepath.Join(dir, "state.db"), boltstore.Options{Timeout: timeout})
	took := time.Since(start)
	if err == nil {
		second.Close()
		t.Fatal("second Open of a locked file succeeded")
	}
	if !errors.Is(err, bolterrors.ErrTimeout) {
		t.Errorf("error = %v, want bbolt's timeout", err)
	}
	// bbolt polls the lock every 50ms and stops one poll early; the upper
	// bound is generous because the point is that it does not wait forever.
	if took < timeout/2 || took > 10*timeout {
		t.Errorf("Open gave up after %v, want about %v", took, timeout)
	}
}

func TestOpenByURL(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		url     string
		wantErr string
	}{
		{url: "bolt:" + filepath.Join(dir, "a", "state.db")},
		{url: "bolt://" + filepath.Join(dir, "b", "state.db")},
		{url: "bolt:relative/state.db", wantErr: "not absolute"},
		{url: "bolt://host/state.db", wantErr: "unexpected host"},
		{url: "bolt:" + filepath.Join(dir, "c.db") + "?timeout=1s", wantErr: "query"},
	}
	for _, tc := range tests {
		t.Run(tc.url, func(t *testing.T) {
			ctx := t.Context()
			s, err := store.Open(ctx, tc.url)
			if tc.wantErr != "" {
				if err == nil {
					s.Close()
					t.Fatalf("Open(%q) succeeded, want error containing %q", tc.url, tc.wantErr)
				}
				if !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Open(%q) = %v, want error containing %q", tc.url, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Open(%q): %v", tc.url, err)
			}
			defer s.Close()
			if _, err := s.Txn(ctx, nil, []store.Op{{Key: "k", Value: []byte("v")}}); err != nil {
				t.Fatal(err)
			}
			if kv, err := s.Get(ctx, "k"); err != nil || string(kv.Value) != "v" {
				t.Fatalf("Get = %+v, %v", kv, err)
			}
		})
	}
	for _, name := range []string{"a/state.db", "b/state.db"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			t.Errorf("URL did not open the file it names: %v", err)
		}
	}
}

func TestOpenURLParseErrorDoesNotEchoURL(t *testing.T) {
	// store.Open parses before it looks up the scheme.
	_, err := store.Open(t.Context(), "bolt://admin:s3cret@db1:notaport/")
	if err == nil {
		t.Fatal("Open of a malformed URL succeeded")
	}
	if strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("error leaks the password: %v", err)
	}
}

// BenchmarkTxnCAS measures one durable compare-and-swap write: a
// create-if-absent Txn on a new key, fsynced before it returns.
func BenchmarkTxnCAS(b *testing.B) {
	s := openIn(b, b.TempDir())
	defer s.Close()
	ctx := context.Background()
	value := make([]byte, 200)
	for i := 0; b.Loop(); i++ {
		key := fmt.Sprintf("codes/%08d", i)
		ok, err := s.Txn(ctx, []store.Cmp{{Key: key}}, []store.Op{{Key: key, Value: value}})
		if err != nil || !ok {
			b.Fatalf("Txn = %v, %v", ok, err)
		}
	}
}

// BenchmarkIncrement measures what spending one use of a code costs: a read
// and a compare-and-swap on the same key.
func BenchmarkIncrement(b *testing.B) {
	s := openIn(b, b.TempDir())
	defer s.Close()
	ctx := context.Background()
	for b.Loop() {
		if _, err := storetest.Increment(ctx, s, "uses"); err != nil {
			b.Fatal(err)
		}
	}
}
