package listener

import (
	"context"
	"encoding/json"
	"path/filepath"
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
	return &Listener{now: time.Now, cluster: cluster.New(cluster.Config{Store: st, Now: time.Now})}, st
}

// A pending join nobody decides ends at its approval deadline, at the
// first poll past it, in fake time.
func TestApprovalWaitDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, st := bubbleListener(t)
		putJoin(t, st, "j1", "pending")
		start := time.Now()
		const wait = 10 * time.Second
		err := l.waitDecision(t.Context(), "j1", start.Add(wait))
		if err == nil || err.Error() != "approval timed out" {
			t.Fatalf("waitDecision = %v, want approval timed out", err)
		}
		if got, want := time.Since(start), wait+approvalPoll; got != want {
			t.Fatalf("timed out after %s, want %s (the first poll past the deadline)", got, want)
		}
	})
}

// An approval that lands while the join waits ends the wait at the next
// poll, long before the deadline.
func TestApprovalWaitDecided(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, st := bubbleListener(t)
		putJoin(t, st, "j1", "pending")
		start := time.Now()
		go func() {
			time.Sleep(5 * time.Second) // fake time: the admin approves 5 s in
			putJoin(t, st, "j1", "approved")
		}()
		if err := l.waitDecision(t.Context(), "j1", start.Add(approvalMaxAge)); err != nil {
			t.Fatalf("waitDecision = %v, want the decision", err)
		}
		if got, want := time.Since(start), 5*time.Second+approvalPoll; got != want {
			t.Fatalf("decided after %s, want %s", got, want)
		}
	})
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
