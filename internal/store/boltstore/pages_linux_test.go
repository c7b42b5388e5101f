package boltstore_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stratumjoin/stratum/internal/procmem"
	"github.com/stratumjoin/stratum/internal/store"
	"github.com/stratumjoin/stratum/internal/store/boltstore"
)

// TestReleasePagesKeepsEveryValue: after a read of the whole store its
// file is resident in the mapping; ReleasePages hands those pages back, and
// every value reads the same after.
func TestReleasePagesKeepsEveryValue(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	want := writeValues(t, path, func(batch, i int) []byte { return bytes.Repeat([]byte{byte(batch), byte(i)}, 300) })
	s, err := boltstore.Open(path, boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	readAll := func() {
		t.Helper()
		got, err := s.List(ctx, "node/", "", 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(want) {
			t.Fatalf("listed %d values, want %d", len(got), len(want))
		}
		for _, kv := range got {
			if !bytes.Equal(kv.Value, want[kv.Key]) {
				t.Fatalf("%s reads %d bytes unlike what was written", kv.Key, len(kv.Value))
			}
		}
	}
	mapped := func() int { t.Helper(); return mappedKiB(t, path) }
	readAll()
	before := mapped()
	if before < 1024 {
		t.Fatalf("only %d KiB of the store resident after reading 2.4 MB of values", before)
	}
	if err := s.ReleasePages(); err != nil {
		t.Fatal(err)
	}
	after := mapped()
	if after > before/10 {
		t.Fatalf("%d KiB of the store still resident after ReleasePages, %d before", after, before)
	}
	readAll()
	t.Logf("resident: %d KiB after a full read, %d KiB after ReleasePages", before, after)
}

// TestReleasePagesAfterWrites: a store opened with ReleasePagesAfter hands
// the pages back by itself once written to, so reads through the mapping
// between writes do not stay resident; Close ends the releases.
func TestReleasePagesAfterWrites(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	ctx := context.Background()
	value := bytes.Repeat([]byte{7}, 600)
	writeValues(t, path, func(int, int) []byte { return value })
	s, err := boltstore.Open(path, boltstore.Options{ReleasePagesAfter: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	mapped := func() int { t.Helper(); return mappedKiB(t, path) }
	// a full read maps the file; the next write schedules a release
	if got, err := s.List(ctx, "node/", "", 0); err != nil || len(got) != 4000 {
		t.Fatalf("listed %d values: %v", len(got), err)
	}
	read := mapped()
	if read < 1024 {
		t.Fatalf("only %d KiB of the store resident after reading 2.4 MB of values", read)
	}
	if _, err := s.Txn(ctx, nil, []store.Op{{Key: "last", Value: []byte("x")}}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for mapped() > read/10 {
		if time.Now().After(deadline) {
			t.Fatalf("%d KiB of the store still resident 10 s after a write, %d after the read", mapped(), read)
		}
		time.Sleep(5 * time.Millisecond) // polling for the release
	}
	if kv, err := s.Get(ctx, "node/039-099"); err != nil || !bytes.Equal(kv.Value, value) {
		t.Fatalf("a value read after the release: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// closing twice is harmless, as bbolt's own Close is
	if err := s.Close(); err != nil {
		t.Fatalf("a second Close: %v", err)
	}
}

// TestReleasePagesEvery: a store opened with ReleasePagesEvery hands the
// pages back in the read or transaction that completes the count, and not
// before, with no timer involved; and only while writes come concurrently.
// One writer at a time leaves the pages to the timer, so that how often a
// read finds its page released does not follow the calls around it.
func TestReleasePagesEvery(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	ctx := context.Background()
	value := bytes.Repeat([]byte{7}, 600)
	writeValues(t, path, func(int, int) []byte { return value })
	s, err := boltstore.Open(path, boltstore.Options{ReleasePagesEvery: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	mapped := func() int { t.Helper(); return mappedKiB(t, path) }
	get := func() {
		t.Helper()
		if kv, err := s.Get(ctx, "node/039-099"); err != nil || !bytes.Equal(kv.Value, value) {
			t.Fatalf("read node/039-099: %v", err)
		}
	}
	if got, err := s.List(ctx, "node/", "", 0); err != nil || len(got) != 4000 { // the first
		t.Fatalf("listed %d values: %v", len(got), err)
	}
	read := mapped()
	if read < 1024 {
		t.Fatalf("only %d KiB of the store resident after reading 2.4 MB of values", read)
	}
	get() // the second
	// the third, a commit of its own
	if _, err := s.Txn(ctx, nil, []store.Op{{Key: "last", Value: []byte("x")}}); err != nil {
		t.Fatal(err)
	}
	if now := mapped(); now < read/2 {
		t.Fatalf("%d KiB of the store resident after the third call, %d after the first: released with one writer at a time", now, read)
	}

	boltstore.ShareCommit(t, s)
	get() // the fourth
	get() // the fifth
	if now := mapped(); now < read/2 {
		t.Fatalf("%d KiB of the store resident after the fifth call, %d after the first: released early", now, read)
	}
	get() // the sixth
	if now := mapped(); now > read/10 {
		t.Fatalf("%d KiB of the store still resident after the sixth call, the third since a shared commit; %d after the first", now, read)
	}
	get()
}

// writeValues writes 4,000 values (node/BBB-III, value(batch, i)) to a
// store file at path, 40 transactions of 100, and closes it. The store
// that writes them releases no pages, so a store opened on the file next
// has no release pending when the test reads it.
func writeValues(t *testing.T, path string, value func(batch, i int) []byte) map[string][]byte {
	t.Helper()
	s, err := boltstore.Open(path, boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	written := map[string][]byte{}
	for batch := range 40 {
		var ops []store.Op
		for i := range 100 {
			key := fmt.Sprintf("node/%03d-%03d", batch, i)
			written[key] = value(batch, i)
			ops = append(ops, store.Op{Key: key, Value: written[key]})
		}
		if _, err := s.Txn(context.Background(), nil, ops); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return written
}

// mappedKiB is how much of the file at path this process has mapped.
func mappedKiB(t *testing.T, path string) int {
	t.Helper()
	kib, err := procmem.MappedKiB(os.Getpid(), path)
	if err != nil {
		t.Fatal(err)
	}
	return kib
}
