package boltstore

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/stratumjoin/stratum/internal/store"
)

// TestGroupCommitSharesOneCommit holds a commit open while ten
// transactions queue behind it, then shows they commit together, each with
// the outcome it would have had alone: the comparisons see the writes made
// before them in the same commit, a failed comparison writes nothing, and
// a transaction that failed mid-way is run again on its own.
func TestGroupCommitSharesOneCommit(t *testing.T) {
	s, err := Open(filepath.Join(t.TempDir(), "state.db"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()

	release, held := holdCommit(s)
	waitQueued := func(n int) {
		deadline := time.Now().Add(10 * time.Second)
		for {
			s.group.mu.Lock()
			q, running := len(s.group.queue), s.group.running
			s.group.mu.Unlock()
			if running && q == n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("queue holds %d, want %d", q, n)
			}
			time.Sleep(time.Millisecond) // polling for the queue length
		}
	}
	waitQueued(0)

	// eight writers of their own key, one that creates "counter" and one
	// that expects "counter" absent: whichever of the two runs second
	// fails its comparison
	var wg sync.WaitGroup
	ok := make([]bool, 10)
	errs := make([]error, 10)
	for i := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("k%d", i)
			cmps := []store.Cmp(nil)
			if i >= 8 {
				key = "counter"
				cmps = []store.Cmp{{Key: "counter", Rev: 0}}
			}
			ok[i], errs[i] = s.Txn(ctx, cmps, []store.Op{{Key: key, Value: []byte(fmt.Sprint(i))}})
		}()
	}
	waitQueued(10)
	s.group.mu.Lock()
	before := s.group.commits
	s.group.mu.Unlock()
	close(release)
	wg.Wait()
	if err := <-held; err != nil {
		t.Fatal(err)
	}
	s.group.mu.Lock()
	shared := s.group.commits - before
	s.group.mu.Unlock()
	if shared != 1 {
		t.Errorf("ten queued transactions took %d commits, want 1", shared)
	}
	won := 0
	for i := range 10 {
		if errs[i] != nil {
			t.Fatalf("txn %d: %v", i, errs[i])
		}
		if i < 8 && !ok[i] {
			t.Errorf("txn %d on its own key failed its comparison", i)
		}
		if i >= 8 && ok[i] {
			won++
		}
	}
	if won != 1 {
		t.Errorf("%d transactions created the same key expecting it absent, want exactly 1", won)
	}
	for i := range 8 {
		kv, err := s.Get(ctx, fmt.Sprintf("k%d", i))
		if err != nil || string(kv.Value) != fmt.Sprint(i) {
			t.Errorf("k%d = %q, %v", i, kv.Value, err)
		}
	}

	// a call that fails after writing aborts the shared commit; the
	// others are committed alone and the failed one leaves nothing
	release2 := make(chan struct{})
	go func() {
		held <- s.writeNotWaitedOn(func(tx *bolt.Tx) error { <-release2; return nil })
	}()
	waitQueued(0)
	boom := errors.New("boom")
	var bad error
	var good bool
	wg.Add(2)
	go func() {
		defer wg.Done()
		bad = s.writeNotWaitedOn(func(tx *bolt.Tx) error {
			if err := tx.Bucket(bucketKV).Put([]byte("half"), append(make([]byte, revLen), 'x')); err != nil {
				return err
			}
			return boom
		})
	}()
	go func() {
		defer wg.Done()
		good, _ = s.Txn(ctx, nil, []store.Op{{Key: "after", Value: []byte("y")}})
	}()
	waitQueued(2)
	close(release2)
	wg.Wait()
	<-held
	if !errors.Is(bad, boom) || !good {
		t.Fatalf("failed call: %v, the other committed: %v", bad, good)
	}
	if kv, _ := s.Get(ctx, "half"); kv.Rev != 0 {
		t.Error("the failed call's write was committed")
	}
	if kv, _ := s.Get(ctx, "after"); string(kv.Value) != "y" {
		t.Error("the call beside the failed one was not committed")
	}
}

// BenchmarkTxnParallel runs many writers at once, as a wave of joins does,
// and reports how many commits (each one fsync'd) they needed per
// transaction: 1 without group commit.
func BenchmarkTxnParallel(b *testing.B) {
	s, err := Open(filepath.Join(b.TempDir(), "state.db"), Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	var mu sync.Mutex
	n := 0
	b.SetParallelism(16)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			mu.Lock()
			n++
			key := fmt.Sprintf("k%d", n)
			mu.Unlock()
			if _, err := s.Txn(ctx, []store.Cmp{{Key: key, Rev: 0}}, []store.Op{{Key: key, Value: []byte("v")}}); err != nil {
				b.Error(err)
				return
			}
		}
	})
	s.group.mu.Lock()
	defer s.group.mu.Unlock()
	b.ReportMetric(float64(s.group.commits)/float64(b.N), "commits/txn")
}

// TestCommitsWaitForCompanyOnlyUnderConcurrency: a commit waits for more
// writers only after a commit that had company, and gives up waiting once
// it commits alone. In the bubble time passes only while every goroutine
// waits, so a wait shows as time gone by and none as no time at all.
func TestCommitsWaitForCompanyOnlyUnderConcurrency(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const linger = 50 * time.Millisecond
		s, err := Open(filepath.Join(t.TempDir(), "state.db"), Options{CommitLinger: linger})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		ctx := context.Background()
		put := func(key string) {
			if _, err := s.Txn(ctx, nil, []store.Op{{Key: key, Value: []byte("v")}}); err != nil {
				t.Error(err)
			}
		}
		commits := func() int {
			s.group.mu.Lock()
			defer s.group.mu.Unlock()
			return s.group.commits
		}

		// one writer after another: no commit waits
		start := time.Now()
		for i := range 5 {
			put(fmt.Sprintf("seq%d", i))
		}
		if d := time.Since(start); d != 0 {
			t.Fatalf("five writes one after another took %v: a commit waited for company it never had", d)
		}

		// a writer queued behind a running commit: the next commit waits
		company := func() {
			t.Helper()
			release, held := holdCommit(s)
			synctest.Wait()
			go put("queued")
			synctest.Wait()
			close(release)
			if err := <-held; err != nil {
				t.Fatal(err)
			}
			synctest.Wait()
		}
		company()

		// two writers 10 ms apart share one commit, which waited its linger
		before := commits()
		start = time.Now()
		var wg sync.WaitGroup
		wg.Go(func() { put("first") })
		wg.Go(func() { time.Sleep(10 * time.Millisecond); put("second") })
		wg.Wait()
		if got, d := commits()-before, time.Since(start); got != 1 || d != linger {
			t.Fatalf("two writers 10 ms apart after a shared commit: %d commits in %v, want 1 in %v", got, d, linger)
		}

		// a commit that waited and found nobody ends the waiting
		start = time.Now()
		put("alone")
		put("after")
		if d := time.Since(start); d != linger {
			t.Fatalf("a lone write after a shared commit, then another: %v, want one wait of %v", d, linger)
		}

		// after a shared commit again, a waited-on write does not wait,
		// and one that joins a waiting commit ends its wait
		waitedOn := store.CommitNow(ctx, func() bool { return true })
		company()
		start = time.Now()
		if _, err := s.Txn(waitedOn, nil, []store.Op{{Key: "urgent", Value: []byte("v")}}); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d != 0 {
			t.Fatalf("a waited-on write after a shared commit took %v, want no wait", d)
		}
		company()
		before = commits()
		start = time.Now()
		wg.Go(func() { put("waiting") })
		wg.Go(func() {
			time.Sleep(10 * time.Millisecond)
			if _, err := s.Txn(waitedOn, nil, []store.Op{{Key: "joins", Value: []byte("v")}}); err != nil {
				t.Error(err)
			}
		})
		wg.Wait()
		if got, d := commits()-before, time.Since(start); got != 1 || d != 10*time.Millisecond {
			t.Fatalf("a waited-on write 10 ms into a commit's wait: %d commits in %v, want 1 in 10ms", got, d)
		}
	})
}

// writeNotWaitedOn is write for a transaction no other waits on.
func (s *Store) writeNotWaitedOn(fn func(*bolt.Tx) error) error { return s.write(fn, false) }

// holdCommit starts a write that holds its commit open until release is
// closed; held reports its outcome.
func holdCommit(s *Store) (release chan struct{}, held chan error) {
	release, held = make(chan struct{}), make(chan error, 1)
	go func() {
		held <- s.writeNotWaitedOn(func(tx *bolt.Tx) error {
			<-release
			return tx.Bucket(bucketKV).Put([]byte("held"), append(make([]byte, revLen), 'x'))
		})
	}()
	return release, held
}
