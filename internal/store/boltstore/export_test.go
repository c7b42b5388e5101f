package boltstore

import (
	"runtime"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// ShareCommit makes one commit carry two writes, as a herd's commits do:
// it holds a write's commit open until a second write has queued behind
// it. Neither write goes through Get, List or Txn, so neither counts
// toward ReleasePagesEvery. For the tests outside the package.
func ShareCommit(t testing.TB, s *Store) {
	t.Helper()
	release, held := holdCommit(s)
	untilGroup(s, func(g *groupCommit) bool { return g.running && len(g.queue) == 0 })
	queued := make(chan error, 1)
	go func() {
		queued <- s.writeNotWaitedOn(func(tx *bolt.Tx) error {
			return tx.Bucket(bucketKV).Put([]byte("queued"), append(make([]byte, revLen), 'x'))
		})
	}()
	untilGroup(s, func(g *groupCommit) bool { return len(g.queue) == 1 })
	close(release)
	if err := <-held; err != nil {
		t.Fatal(err)
	}
	if err := <-queued; err != nil {
		t.Fatal(err)
	}
}

// untilGroup yields until cond holds of the store's group commit.
func untilGroup(s *Store, cond func(*groupCommit) bool) {
	for {
		s.group.mu.Lock()
		ok := cond(&s.group)
		s.group.mu.Unlock()
		if ok {
			return
		}
		runtime.Gosched()
	}
}
