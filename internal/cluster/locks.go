package cluster

import (
	"context"
	"sync"
	"time"

	"github.com/stratumjoin/stratum/internal/store"
)

// secretLocks orders this process's updates of one secret. Correctness
// never rests on it (every update compares what it read at commit), but
// without it a wave of joins with one token or code races on the secret's
// record: of n rounds that read the same revision, one commits and n-1 run
// again, decoding the record (and, in Prove, signing a certificate) each
// time, so a wave of n costs on the order of n² rounds. In turn, each
// commits at its first round, and the rounds of other secrets still share
// group commits.
type secretLocks struct {
	mu sync.Mutex
	m  map[string]*secretLock
}

type secretLock struct {
	ch   chan struct{}
	refs int
}

// lockWait bounds the wait for a secret's lock: past it the update runs
// unordered, as it would without the lock, so a store that hangs makes
// the waiters fail by their own deadlines rather than one after another.
const lockWait = 2 * time.Second

// lock takes the lock of a secret (by locator); the returned func frees
// it. The returned context marks the update's commit as waited on
// (store.CommitNow) while another update of the secret waits for the
// lock: it queues behind this one and cannot share its commit, so the
// commit must not wait for company.
func (s *secretLocks) lock(ctx context.Context, locator string) (context.Context, func()) {
	s.mu.Lock()
	if s.m == nil {
		s.m = map[string]*secretLock{}
	}
	e := s.m[locator]
	if e == nil {
		e = &secretLock{ch: make(chan struct{}, 1)}
		s.m[locator] = e
	}
	e.refs++
	s.mu.Unlock()
	held := false
	select {
	case e.ch <- struct{}{}:
		held = true
	default:
		t := time.NewTimer(lockWait)
		select {
		case e.ch <- struct{}{}:
			held = true
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
	waited := func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return e.refs > 1
	}
	return store.CommitNow(ctx, waited), func() {
		if held {
			<-e.ch
		}
		s.mu.Lock()
		if e.refs--; e.refs == 0 {
			delete(s.m, locator)
		}
		s.mu.Unlock()
	}
}

// onceNodeID makes a node id at the first round and keeps it for the
// rounds after, so that memoIssue's certificate still names it.
func onceNodeID(f func() (string, error)) func() (string, error) {
	var id string
	return func() (string, error) {
		if id != "" {
			return id, nil
		}
		v, err := f()
		if err == nil {
			id = v
		}
		return v, err
	}
}

// memoIssue signs once per node id and role across an update's rounds: a
// round that lost its comparison throws away only its writes, and the
// certificate it signed has not left, so the next round may commit it.
func memoIssue(f Issuer) Issuer {
	if f == nil {
		return nil
	}
	type key struct{ node, role string }
	made := map[key]Cert{}
	return func(nodeID, role string) (Cert, error) {
		k := key{nodeID, role}
		if c, ok := made[k]; ok {
			return c, nil
		}
		c, err := f(nodeID, role)
		if err == nil {
			made[k] = c
		}
		return c, err
	}
}
