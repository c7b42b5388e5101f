package listener

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stratumjoin/stratum/internal/cluster"
	"github.com/stratumjoin/stratum/internal/store"
	"github.com/stratumjoin/stratum/internal/store/boltstore"
)

// putJoin writes a join record in the state given, as the admin API's
// approve and refuse leave it.
func putJoin(t *testing.T, st store.Store, id, state string) {
	t.Helper()
	b, err := json.Marshal(cluster.Join{ID: id, State: state})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := st.Txn(context.Background(), nil, []store.Op{{Key: "join/" + id, Value: b}}); err != nil || !ok {
		t.Fatalf("put join: %v %v", ok, err)
	}
}

func bubbleListener(t *testing.T) (*Listener, store.Store) {
	t.Helper()
	st, err := boltstore.Open(filepath.Join(t.TempDir(), "state.db"), boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return listenerOn(st), st
}

func listenerOn(st store.Store) *Listener {
	return &Listener{now: time.Now, logger: slog.New(slog.DiscardHandler), cluster: cluster.New(cluster.Config{Store: st, Now: time.Now})}
}

// joinReads counts the reads of join records, and watches as its store
// does unless it is told not to.
type joinReads struct {
	store.Store
	reads, watches atomic.Int32
	// noWatch hides the store's watch, as a backend without one
	noWatch bool
	// breakAfter closes each watch this long after it began, as a lost
	// etcd member does
	breakAfter time.Duration
}

func (s *joinReads) Get(ctx context.Context, key string) (store.KV, error) {
	if strings.HasPrefix(key, "join/") {
		s.reads.Add(1)
	}
	return s.Store.Get(ctx, key)
}

func (s *joinReads) Watch(ctx context.Context, key string) (<-chan struct{}, error) {
	if s.noWatch {
		return nil, errors.New("this store cannot watch")
	}
	s.watches.Add(1)
	if s.breakAfter == 0 {
		return s.Store.(store.Watcher).Watch(ctx, key)
	}
	// the watch's own context ends it; the caller's ending first does too
	wctx, cancel := context.WithTimeout(ctx, s.breakAfter)
	ch, err := s.Store.(store.Watcher).Watch(wctx, key)
	context.AfterFunc(wctx, cancel)
	return ch, err
}

// A pending join nobody decides ends at its approval deadline, in fake
// time, having read its record once.
func TestApprovalWaitDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, st := bubbleListener(t)
		counted := &joinReads{Store: st}
		l := listenerOn(counted)
		putJoin(t, st, "j1", "pending")
		start := time.Now()
		const wait = 10 * time.Second
		err := l.waitDecision(t.Context(), "j1", start.Add(wait))
		if err == nil || err.Error() != "approval timed out" {
			t.Fatalf("waitDecision = %v, want approval timed out", err)
		}
		if got := time.Since(start); got != wait {
			t.Fatalf("timed out after %s, want %s", got, wait)
		}
		if got := counted.reads.Load(); got != 1 {
			t.Fatalf("read the join %d times while nothing changed, want once", got)
		}
	})
}

// An approval that lands while the join waits ends the wait when it
// commits, whether the store watches, cannot watch (then at the next
// poll), or its watch breaks and is renewed meanwhile.
func TestApprovalWaitDecided(t *testing.T) {
	const decidedAt = 5*time.Second + 100*time.Millisecond
	for _, tc := range []struct {
		name           string
		noWatch        bool
		breakAfter     time.Duration
		want           time.Duration
		reads          int32
		atLeastWatches int32
	}{
		{"watched", false, 0, decidedAt, 2, 1},
		{"no watch", true, 0, 5*time.Second + approvalPoll, 22, 0}, // a read at 0 and at each of 21 polls
		// broken at 1, 2, 3, 4 and 5 s: each break costs one read
		{"watch breaks each second", false, time.Second, decidedAt, 7, 6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				_, st := bubbleListener(t)
				counted := &joinReads{Store: st, noWatch: tc.noWatch, breakAfter: tc.breakAfter}
				l := listenerOn(counted)
				putJoin(t, st, "j1", "pending")
				start := time.Now()
				go func() {
					time.Sleep(decidedAt) // fake time: the admin approves
					putJoin(t, st, "j1", "approved")
				}()
				if err := l.waitDecision(t.Context(), "j1", start.Add(approvalMaxAge)); err != nil {
					t.Fatalf("waitDecision = %v, want the decision", err)
				}
				if got := time.Since(start); got != tc.want {
					t.Fatalf("decided after %s, want %s", got, tc.want)
				}
				if got := counted.reads.Load(); got != tc.reads {
					t.Fatalf("read the join %d times, want %d", got, tc.reads)
				}
				if got := counted.watches.Load(); got < tc.atLeastWatches {
					t.Fatalf("watched %d times, want at least %d", got, tc.atLeastWatches)
				}
			})
		})
	}
}

// Starts waiting on one secret are woken one at a time, oldest first, as
// its leases end; one that gives up after being woken passes the wake-up
// on.
func TestLeaseQueueOneAtATime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var q leaseQueue
		woken := make(chan int, 4)
		chans := make([]<-chan struct{}, 4)
		for i := range chans {
			chans[i] = q.wait("s")
		}
		other := q.wait("t") // another secret's waiter is never woken by s's leases
		for i, ch := range chans[:3] {
			go func() { <-ch; woken <- i }()
		}
		for want := range 2 {
			q.release("s")
			synctest.Wait() // every waiter is blocked again: the one release woke whom it woke
			if len(woken) != 1 {
				t.Fatalf("release %d woke %d starts, want 1", want, len(woken))
			}
			if got := <-woken; got != want {
				t.Fatalf("release woke start %d, want %d (oldest first)", got, want)
			}
		}
		// a start that leaves before it is woken is out of the queue; the
		// next release goes to the one still waiting
		q.leave("s", chans[3])
		q.release("s")
		synctest.Wait()
		if got := <-woken; got != 2 {
			t.Fatalf("release woke start %d, want 2", got)
		}
		select {
		case <-other:
			t.Fatal("a release of s woke a start waiting on t")
		default:
		}
		// a woken start that gives up hands its wake-up to the next
		next := q.wait("s")
		last := q.wait("s")
		q.release("s")
		q.leave("s", next)
		synctest.Wait()
		select {
		case <-last:
		default:
			t.Fatal("the wake-up of a start that left was lost")
		}
	})
}
