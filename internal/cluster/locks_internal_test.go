package cluster

import (
	"context"
	"testing"
	"testing/synctest"

	"github.com/stratumjoin/stratum/internal/store"
)

// A waiter whose context ends goes on without the lock, and its unlock
// leaves the holder's lock held; the last unlock forgets the locator.
func TestSecretLocksGiveUpWithoutTakingOver(t *testing.T) {
	var s secretLocks
	_, unlockA := s.lock(context.Background(), "AB")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, unlockB := s.lock(ctx, "AB") // the lock is held: B gives up at once
	unlockB()
	select {
	case s.m["AB"].ch <- struct{}{}:
		t.Fatal("B's unlock freed A's lock")
	default:
	}
	unlockA()
	if len(s.m) != 0 {
		t.Fatalf("%d locators left after every unlock", len(s.m))
	}
	_, unlockC := s.lock(context.Background(), "AB") // free again: no wait
	unlockC()
}

// TestSecretLockMarksWaitedOnCommits: the holder's commit is waited on
// (store.Waited) exactly while another update of the same secret waits for
// the lock; another secret's waiter does not count.
func TestSecretLockMarksWaitedOnCommits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var s secretLocks
		ctxA, unlockA := s.lock(context.Background(), "AB")
		_, unlockOther := s.lock(context.Background(), "CD")
		if store.Waited(ctxA) {
			t.Fatal("the holder is waited on with nobody waiting for its secret")
		}
		done := make(chan struct{})
		go func() {
			ctxB, unlockB := s.lock(context.Background(), "AB")
			if store.Waited(ctxB) {
				t.Error("B, holding the lock after A with nobody behind it, is waited on")
			}
			unlockB()
			close(done)
		}()
		synctest.Wait() // B waits for A's lock
		if !store.Waited(ctxA) {
			t.Fatal("the holder is not waited on while B waits for its secret")
		}
		unlockA()
		<-done
		unlockOther()
	})
}
