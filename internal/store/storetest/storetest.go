// Package storetest is the one conformance suite every store backend passes.
// A backend's test calls Run with a function that opens a fresh, empty store;
// a backend whose data lives in a directory also calls RunReopen.
//
// New store behaviour that callers rely on goes into this suite first, so
// that the bolt and etcd backends cannot drift apart.
package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stratumjoin/stratum/internal/store"
)

// suiteTimeout bounds each subtest's store calls, so a hung backend fails
// the test instead of stalling it.
const suiteTimeout = 60 * time.Second

// Run runs every conformance subtest. open returns a new, empty store for
// one subtest; the suite closes it (at least once: Close must tolerate a
// second call).
func Run(t *testing.T, open func(t *testing.T) store.Store) {
	tests := []struct {
		name string
		fn   func(t *testing.T, ctx context.Context, s store.Store)
	}{
		{"GetMissing", testGetMissing},
		{"CreateIfAbsent", testCreateIfAbsent},
		{"CompareAndSwap", testCompareAndSwap},
		{"EmptyValueExists", testEmptyValueExists},
		{"MultiKeyAtomic", testMultiKeyAtomic},
		{"RevisionIsGlobal", testRevisionIsGlobal},
		{"Delete", testDelete},
		{"CompareOnly", testCompareOnly},
		{"InvalidTxn", testInvalidTxn},
		{"ListOrderAndPrefix", testListOrderAndPrefix},
		{"ListPaging", testListPaging},
		{"ValuesAreCopies", testValuesAreCopies},
		{"CancelledContext", testCancelledContext},
		{"ConcurrentIncrements", testConcurrentIncrements},
		{"ReserveAtMost", testReserveAtMost},
		{"UseAfterClose", testUseAfterClose},
		{"Watch", testWatch},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := open(t)
			t.Cleanup(func() {
				if err := s.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
			})
			ctx, cancel := context.WithTimeout(t.Context(), suiteTimeout)
			defer cancel()
			tc.fn(t, ctx, s)
		})
	}
}

// RunReopen proves that what a Txn wrote survives Close: open(t, dir) must
// open the store kept in dir, creating it when dir is empty.
func RunReopen(t *testing.T, open func(t *testing.T, dir string) store.Store) {
	ctx, cancel := context.WithTimeout(t.Context(), suiteTimeout)
	defer cancel()
	dir := t.TempDir()

	s := open(t, dir)
	mustTxn(t, ctx, s, nil, []store.Op{{Key: "keep", Value: []byte("v1")}, {Key: "gone", Value: []byte("x")}})
	keep := mustGet(t, ctx, s, "keep")
	mustTxn(t, ctx, s, []store.Cmp{{Key: "gone", Rev: keep.Rev}}, []store.Op{{Key: "gone", Delete: true}})
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}

	s = open(t, dir)
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close after reopen: %v", err)
		}
	})
	got := mustGet(t, ctx, s, "keep")
	if !bytes.Equal(got.Value, []byte("v1")) || got.Rev != keep.Rev {
		t.Fatalf("after reopen keep = %q rev %d, want %q rev %d", got.Value, got.Rev, "v1", keep.Rev)
	}
	if gone := mustGet(t, ctx, s, "gone"); gone.Rev != 0 {
		t.Fatalf("deleted key came back after reopen: rev %d", gone.Rev)
	}
	// The revision counter is durable too: a revision handed out before the
	// restart is never handed out again, or a caller's stale compare could
	// succeed.
	mustTxn(t, ctx, s, nil, []store.Op{{Key: "new", Value: []byte("n")}})
	if n := mustGet(t, ctx, s, "new"); n.Rev <= keep.Rev+1 {
		t.Fatalf("revision after reopen = %d, want > %d (the delete's revision)", n.Rev, keep.Rev+1)
	}
}

// Increment adds one to the decimal counter at key (absent = 0) with a
// compare-and-swap loop, and returns the value it replaced.
func Increment(ctx context.Context, s store.Store, key string) (int64, error) {
	for {
		kv, n, err := getCounter(ctx, s, key)
		if err != nil {
			return 0, err
		}
		ok, err := s.Txn(ctx, []store.Cmp{{Key: key, Rev: kv.Rev}},
			[]store.Op{{Key: key, Value: strconv.AppendInt(nil, n+1, 10)}})
		if err != nil {
			return 0, err
		}
		if ok {
			return n, nil
		}
	}
}

// IncrementBelow adds one to the counter at key only while it is below limit,
// the way a code's use count is spent; it reports whether it did.
func IncrementBelow(ctx context.Context, s store.Store, key string, limit int64) (bool, error) {
	for {
		kv, n, err := getCounter(ctx, s, key)
		if err != nil {
			return false, err
		}
		if n >= limit {
			return false, nil
		}
		ok, err := s.Txn(ctx, []store.Cmp{{Key: key, Rev: kv.Rev}},
			[]store.Op{{Key: key, Value: strconv.AppendInt(nil, n+1, 10)}})
		if err != nil {
			return false, err
		}
		if ok {
			return true, nil
		}
	}
}

func getCounter(ctx context.Context, s store.Store, key string) (store.KV, int64, error) {
	kv, err := s.Get(ctx, key)
	if err != nil {
		return kv, 0, err
	}
	if kv.Rev == 0 {
		return kv, 0, nil
	}
	n, err := strconv.ParseInt(string(kv.Value), 10, 64)
	if err != nil {
		return kv, 0, fmt.Errorf("counter %q: %w", key, err)
	}
	return kv, n, nil
}

func mustGet(t *testing.T, ctx context.Context, s store.Store, key string) store.KV {
	t.Helper()
	kv, err := s.Get(ctx, key)
	if err != nil {
		t.Fatalf("Get(%q): %v", key, err)
	}
	if kv.Key != key {
		t.Fatalf("Get(%q) returned key %q", key, kv.Key)
	}
	return kv
}

// mustTxn runs a Txn that must succeed.
func mustTxn(t *testing.T, ctx context.Context, s store.Store, cmps []store.Cmp, ops []store.Op) {
	t.Helper()
	if !txn(t, ctx, s, cmps, ops) {
		t.Fatalf("Txn(%v, %d ops) = false, want true", cmps, len(ops))
	}
}

// txn runs a Txn that must not error and returns whether it applied.
func txn(t *testing.T, ctx context.Context, s store.Store, cmps []store.Cmp, ops []store.Op) bool {
	t.Helper()
	ok, err := s.Txn(ctx, cmps, ops)
	if err != nil {
		t.Fatalf("Txn(%v, %d ops): %v", cmps, len(ops), err)
	}
	return ok
}

func mustList(t *testing.T, ctx context.Context, s store.Store, prefix, after string, limit int) []store.KV {
	t.Helper()
	kvs, err := s.List(ctx, prefix, after, limit)
	if err != nil {
		t.Fatalf("List(%q, %q, %d): %v", prefix, after, limit, err)
	}
	return kvs
}

func keysOf(kvs []store.KV) []string {
	keys := make([]string, 0, len(kvs))
	for _, kv := range kvs {
		keys = append(keys, kv.Key)
	}
	return keys
}

func put(key, value string) store.Op { return store.Op{Key: key, Value: []byte(value)} }

func testGetMissing(t *testing.T, ctx context.Context, s store.Store) {
	kv := mustGet(t, ctx, s, "missing")
	if kv.Rev != 0 || kv.Value != nil {
		t.Fatalf("Get(missing) = %+v, want Rev 0 and no value", kv)
	}
}

func testCreateIfAbsent(t *testing.T, ctx context.Context, s store.Store) {
	// Bytes that a string-minded backend could mangle.
	value := []byte{0, 1, 0xff, 0xfe, '\n', 0}
	if !txn(t, ctx, s, []store.Cmp{{Key: "k", Rev: 0}}, []store.Op{{Key: "k", Value: value}}) {
		t.Fatal("first create-if-absent failed")
	}
	first := mustGet(t, ctx, s, "k")
	if first.Rev <= 0 || !bytes.Equal(first.Value, value) {
		t.Fatalf("after create Get = %+v, want value %v and Rev > 0", first, value)
	}
	if txn(t, ctx, s, []store.Cmp{{Key: "k", Rev: 0}}, []store.Op{put("k", "second")}) {
		t.Fatal("second create-if-absent succeeded")
	}
	if got := mustGet(t, ctx, s, "k"); got.Rev != first.Rev || !bytes.Equal(got.Value, value) {
		t.Fatalf("failed create changed the key: %+v, want %+v", got, first)
	}
}

func testCompareAndSwap(t *testing.T, ctx context.Context, s store.Store) {
	mustTxn(t, ctx, s, []store.Cmp{{Key: "k"}}, []store.Op{put("k", "v1")})
	v1 := mustGet(t, ctx, s, "k")
	if !txn(t, ctx, s, []store.Cmp{{Key: "k", Rev: v1.Rev}}, []store.Op{put("k", "v2")}) {
		t.Fatal("CAS with the current revision failed")
	}
	v2 := mustGet(t, ctx, s, "k")
	if string(v2.Value) != "v2" || v2.Rev <= v1.Rev {
		t.Fatalf("after CAS Get = %q rev %d, want %q rev > %d", v2.Value, v2.Rev, "v2", v1.Rev)
	}
	for _, stale := range []int64{v1.Rev, 0, v2.Rev + 1000} {
		if txn(t, ctx, s, []store.Cmp{{Key: "k", Rev: stale}}, []store.Op{put("k", "v3")}) {
			t.Fatalf("CAS with revision %d succeeded; current is %d", stale, v2.Rev)
		}
	}
	if got := mustGet(t, ctx, s, "k"); string(got.Value) != "v2" || got.Rev != v2.Rev {
		t.Fatalf("failed CAS changed the key: %q rev %d", got.Value, got.Rev)
	}
}

func testEmptyValueExists(t *testing.T, ctx context.Context, s store.Store) {
	mustTxn(t, ctx, s, nil, []store.Op{{Key: "empty"}})
	kv := mustGet(t, ctx, s, "empty")
	if kv.Rev == 0 || len(kv.Value) != 0 {
		t.Fatalf("key with empty value = %+v, want Rev > 0 and empty value", kv)
	}
	if txn(t, ctx, s, []store.Cmp{{Key: "empty", Rev: 0}}, []store.Op{put("empty", "x")}) {
		t.Fatal("create-if-absent succeeded over a key holding an empty value")
	}
}

func testMultiKeyAtomic(t *testing.T, ctx context.Context, s store.Store) {
	mustTxn(t, ctx, s, nil, []store.Op{put("a", "a1")})
	mustTxn(t, ctx, s, nil, []store.Op{put("b", "b1")})
	a, b := mustGet(t, ctx, s, "a"), mustGet(t, ctx, s, "b")

	ops := []store.Op{put("a", "a2"), put("b", "b2"), put("c", "c2")}
	if txn(t, ctx, s, []store.Cmp{{Key: "a", Rev: a.Rev}, {Key: "b", Rev: a.Rev}}, ops) {
		t.Fatal("Txn with one stale comparison succeeded")
	}
	if got := mustGet(t, ctx, s, "a"); string(got.Value) != "a1" || got.Rev != a.Rev {
		t.Fatalf("failed Txn wrote a: %q rev %d", got.Value, got.Rev)
	}
	if got := mustGet(t, ctx, s, "c"); got.Rev != 0 {
		t.Fatalf("failed Txn created c: %q rev %d", got.Value, got.Rev)
	}

	mustTxn(t, ctx, s, []store.Cmp{{Key: "a", Rev: a.Rev}, {Key: "b", Rev: b.Rev}, {Key: "c"}}, ops)
	var rev int64
	for _, want := range ops {
		got := mustGet(t, ctx, s, want.Key)
		if !bytes.Equal(got.Value, want.Value) {
			t.Fatalf("%s = %q, want %q", want.Key, got.Value, want.Value)
		}
		if rev == 0 {
			rev = got.Rev
		}
		if got.Rev != rev || got.Rev <= b.Rev {
			t.Fatalf("%s rev = %d; every key of one Txn should carry the same revision (%d), above %d", want.Key, got.Rev, rev, b.Rev)
		}
	}
}

func testRevisionIsGlobal(t *testing.T, ctx context.Context, s store.Store) {
	var last int64
	for i := range 5 {
		key := fmt.Sprintf("key%d", i)
		mustTxn(t, ctx, s, nil, []store.Op{put(key, "v")})
		kv := mustGet(t, ctx, s, key)
		if kv.Rev <= last {
			t.Fatalf("%s rev %d not above the previous Txn's %d", key, kv.Rev, last)
		}
		last = kv.Rev
	}
}

func testDelete(t *testing.T, ctx context.Context, s store.Store) {
	mustTxn(t, ctx, s, nil, []store.Op{put("k", "v")})
	kv := mustGet(t, ctx, s, "k")
	if txn(t, ctx, s, []store.Cmp{{Key: "k", Rev: kv.Rev + 1}}, []store.Op{{Key: "k", Delete: true}}) {
		t.Fatal("delete with a stale revision succeeded")
	}
	mustTxn(t, ctx, s, []store.Cmp{{Key: "k", Rev: kv.Rev}}, []store.Op{{Key: "k", Delete: true}})
	if got := mustGet(t, ctx, s, "k"); got.Rev != 0 || got.Value != nil {
		t.Fatalf("deleted key = %+v, want absent", got)
	}
	if got := mustList(t, ctx, s, "", "", 0); len(got) != 0 {
		t.Fatalf("List after delete = %v, want empty", keysOf(got))
	}
	// Deleting an absent key is not an error.
	mustTxn(t, ctx, s, nil, []store.Op{{Key: "never", Delete: true}})
	mustTxn(t, ctx, s, []store.Cmp{{Key: "k", Rev: 0}}, []store.Op{put("k", "again")})
	if again := mustGet(t, ctx, s, "k"); again.Rev <= kv.Rev {
		t.Fatalf("recreated key rev %d, want above %d", again.Rev, kv.Rev)
	}
}

func testCompareOnly(t *testing.T, ctx context.Context, s store.Store) {
	mustTxn(t, ctx, s, nil, []store.Op{put("k", "v")})
	kv := mustGet(t, ctx, s, "k")
	if !txn(t, ctx, s, []store.Cmp{{Key: "k", Rev: kv.Rev}, {Key: "absent"}}, nil) {
		t.Fatal("Txn with holding comparisons and no ops = false")
	}
	if txn(t, ctx, s, []store.Cmp{{Key: "k"}}, nil) {
		t.Fatal("Txn with a failing comparison and no ops = true")
	}
	if got := mustGet(t, ctx, s, "k"); got.Rev != kv.Rev {
		t.Fatalf("Txn without ops changed k's rev to %d from %d", got.Rev, kv.Rev)
	}
}

func testInvalidTxn(t *testing.T, ctx context.Context, s store.Store) {
	tooMany := make([]store.Op, 129)
	for i := range tooMany {
		tooMany[i] = put(fmt.Sprintf("many%03d", i), "v")
	}
	tests := []struct {
		name string
		cmps []store.Cmp
		ops  []store.Op
	}{
		{"empty op key", nil, []store.Op{put("ok", "v"), put("", "v")}},
		{"empty cmp key", []store.Cmp{{Key: ""}}, []store.Op{put("ok", "v")}},
		{"key written twice", nil, []store.Op{put("ok", "v"), {Key: "ok", Delete: true}}},
		{"more ops than etcd allows", nil, tooMany},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if ok, err := s.Txn(ctx, tc.cmps, tc.ops); err == nil {
				t.Fatalf("Txn = %v, nil; want an error", ok)
			}
			if got := mustList(t, ctx, s, "", "", 0); len(got) != 0 {
				t.Fatalf("rejected Txn wrote %v", keysOf(got))
			}
		})
	}
}

func testListOrderAndPrefix(t *testing.T, ctx context.Context, s store.Store) {
	all := []string{"a", "a/1", "a/10", "a/2", "a/\xff", "ab/1", "b/1"}
	for _, k := range slices.Backward(all) {
		mustTxn(t, ctx, s, nil, []store.Op{put(k, "value of "+k)})
	}
	tests := []struct {
		prefix, after string
		limit         int
		want          []string
	}{
		{"", "", 0, all},
		{"a/", "", 0, []string{"a/1", "a/10", "a/2", "a/\xff"}},
		{"a/", "", -1, []string{"a/1", "a/10", "a/2", "a/\xff"}},
		{"a", "", 0, []string{"a", "a/1", "a/10", "a/2", "a/\xff", "ab/1"}},
		{"ab/", "", 0, []string{"ab/1"}},
		{"c/", "", 0, nil},
		{"a/", "a/10", 0, []string{"a/2", "a/\xff"}},
		{"a/", "a/15", 0, []string{"a/2", "a/\xff"}}, // after need not exist
		{"a/", "0", 0, []string{"a/1", "a/10", "a/2", "a/\xff"}},
		{"a/", "a/\xff", 0, nil},
		{"a/", "b", 0, nil},
		{"", "a/2", 2, []string{"a/\xff", "ab/1"}},
	}
	for _, tc := range tests {
		got := mustList(t, ctx, s, tc.prefix, tc.after, tc.limit)
		if !slices.Equal(keysOf(got), tc.want) {
			t.Errorf("List(%q, %q, %d) = %q, want %q", tc.prefix, tc.after, tc.limit, keysOf(got), tc.want)
		}
	}
	for _, kv := range mustList(t, ctx, s, "", "", 0) {
		want := mustGet(t, ctx, s, kv.Key)
		if !bytes.Equal(kv.Value, want.Value) || kv.Rev != want.Rev {
			t.Errorf("List gave %s = %q rev %d, Get gives %q rev %d", kv.Key, kv.Value, kv.Rev, want.Value, want.Rev)
		}
	}
}

func testListPaging(t *testing.T, ctx context.Context, s store.Store) {
	var want []string
	for i := range 23 {
		key := fmt.Sprintf("node/%02d", i)
		want = append(want, key)
		mustTxn(t, ctx, s, nil, []store.Op{put(key, "v")})
	}
	mustTxn(t, ctx, s, nil, []store.Op{put("nodes", "outside"), put("code/1", "outside")})
	for _, limit := range []int{1, 5, 23, 100} {
		var got []string
		after := ""
		for pages := 0; ; pages++ {
			if pages > len(want) {
				t.Fatalf("limit %d: paging does not end", limit)
			}
			page := mustList(t, ctx, s, "node/", after, limit)
			if len(page) > limit {
				t.Fatalf("limit %d: page of %d", limit, len(page))
			}
			got = append(got, keysOf(page)...)
			if len(page) < limit {
				break
			}
			after = page[len(page)-1].Key
		}
		if !slices.Equal(got, want) {
			t.Errorf("limit %d: pages gave %q, want %q", limit, got, want)
		}
	}
}

func testValuesAreCopies(t *testing.T, ctx context.Context, s store.Store) {
	value := []byte("original")
	mustTxn(t, ctx, s, nil, []store.Op{{Key: "k", Value: value}})
	copy(value, "XXXXXXXX") // the caller reuses its buffer after Txn

	got := mustGet(t, ctx, s, "k")
	if string(got.Value) != "original" {
		t.Fatalf("store kept the caller's buffer: %q", got.Value)
	}
	copy(got.Value, "YYYYYYYY")
	listed := mustList(t, ctx, s, "", "", 0)
	if len(listed) != 1 || string(listed[0].Value) != "original" {
		t.Fatalf("mutating Get's value changed the store: %v", listed)
	}
	copy(listed[0].Value, "ZZZZZZZZ")
	if again := mustGet(t, ctx, s, "k"); string(again.Value) != "original" {
		t.Fatalf("mutating List's value changed the store: %q", again.Value)
	}
}

func testCancelledContext(t *testing.T, ctx context.Context, s store.Store) {
	mustTxn(t, ctx, s, nil, []store.Op{put("k", "v")})
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := s.Get(cancelled, "k"); err == nil {
		t.Error("Get with a cancelled context: no error")
	}
	if _, err := s.List(cancelled, "", "", 0); err == nil {
		t.Error("List with a cancelled context: no error")
	}
	if _, err := s.Txn(cancelled, nil, []store.Op{put("x", "v")}); err == nil {
		t.Error("Txn with a cancelled context: no error")
	}
}

func testConcurrentIncrements(t *testing.T, ctx context.Context, s store.Store) {
	const workers, each = 32, 25
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		priors []int64
		errs   []error
	)
	for range workers {
		wg.Go(func() {
			for range each {
				prior, err := Increment(ctx, s, "counter")
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				} else {
					priors = append(priors, prior)
				}
				mu.Unlock()
				if err != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("Increment: %v", err)
	}
	_, n, err := getCounter(ctx, s, "counter")
	if err != nil {
		t.Fatal(err)
	}
	if n != workers*each {
		t.Fatalf("counter = %d, want %d", n, workers*each)
	}
	// Each successful CAS replaced a different value: no two writers both
	// won against the same read.
	slices.Sort(priors)
	for i, p := range priors {
		if p != int64(i) {
			t.Fatalf("successful increments replaced %d at position %d; want each of 0..%d once", p, i, workers*each-1)
		}
	}
}

func testReserveAtMost(t *testing.T, ctx context.Context, s store.Store) {
	const workers, limit = 50, 10
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		won  int
		errs []error
	)
	for range workers {
		wg.Go(func() {
			ok, err := IncrementBelow(ctx, s, "uses", limit)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
			}
			if ok {
				won++
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("IncrementBelow: %v", err)
	}
	if won != limit {
		t.Fatalf("%d reservations succeeded, want exactly %d", won, limit)
	}
	if _, n, err := getCounter(ctx, s, "uses"); err != nil || n != limit {
		t.Fatalf("uses = %d (%v), want %d", n, err, limit)
	}
}

func testUseAfterClose(t *testing.T, ctx context.Context, s store.Store) {
	mustTxn(t, ctx, s, nil, []store.Op{put("k", "v")})
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, err := s.Get(ctx, "k"); err == nil {
		t.Error("Get after Close: no error")
	}
	if _, err := s.List(ctx, "", "", 0); err == nil {
		t.Error("List after Close: no error")
	}
	if _, err := s.Txn(ctx, nil, []store.Op{put("x", "v")}); err == nil {
		t.Error("Txn after Close: no error")
	}
	// The suite's cleanup closes the store a second time, which must succeed.
}
