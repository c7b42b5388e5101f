package cluster

import (
	"context"
	"testing"
)

// A waiter whose context ends goes on without the lock, and its unlock
// leaves the holder's lock held; the last unlock forgets the locator.
func TestSecretLocksGiveUpWithoutTakingOver(t *testing.T) {
	var s secretLocks
	unlockA := s.lock(context.Background(), "AB")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	unlockB := s.lock(ctx, "AB") // the lock is held: B gives up at once
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
	unlockC := s.lock(context.Background(), "AB") // free again: no wait
	unlockC()
}
