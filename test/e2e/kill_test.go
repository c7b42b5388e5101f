package e2e

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stratumjoin/stratum/agent"
	"github.com/stratumjoin/stratum/internal/joincode"
)

// TestKillDuringStorm SIGKILLs the listener while wrong codes storm one
// code and right codes race another, then restarts it: no code's unproven
// count is ever below what the agents saw, and no code exceeds its uses.
func TestKillDuringStorm(t *testing.T) {
	// the storm's wrong codes all come from one address: lift its budget
	l := newListenerServe(t, []string{"--unproven-per-source=-1"})
	var stormed, raced mintedCode
	l.adminJSON(&stormed, "codes", "create", "--auto-approve", "--max-uses", "5")
	l.adminJSON(&raced, "codes", "create", "--auto-approve", "--max-uses", "2")
	stormSec, _ := joincode.Parse(stormed.Code)
	raceSec, _ := joincode.Parse(raced.Code)
	dir := t.TempDir()

	var (
		wg         sync.WaitGroup
		challenged atomic.Int32 // wrong-code exchanges that got a KE2 (each was counted first, unless the code was burned)
		joined     atomic.Int32
		n          atomic.Int32
	)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stop := make(chan struct{})
	worker := func(sec joincode.Secret, wrong bool) {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			s := sec
			if wrong {
				for string(s.Password()) == string(sec.Password()) {
					s, _ = joincode.NewCode(sec.Locator)
				}
			}
			state := filepath.Join(dir, fmt.Sprint(n.Add(1)))
			_, err := agent.Join(ctx, agent.JoinConfig{StateDir: state, Endpoint: l.endpoint, Secret: s, DialTimeout: time.Second})
			var unreachable *agent.UnreachableError
			switch {
			case err == nil:
				joined.Add(1)
			case errors.Is(err, agent.ErrNotAccepted):
				challenged.Add(1)
			case errors.As(err, &unreachable), ctx.Err() != nil:
				return
			}
		}
	}
	for range 6 {
		wg.Add(1)
		go worker(stormSec, true)
	}
	for range 4 {
		wg.Add(1)
		go worker(raceSec, false)
	}
	// the kill comes once a wrong attempt has been counted, with the
	// workers' next exchanges in flight: the kill must cut some
	for deadline := time.Now().Add(15 * time.Second); challenged.Load() == 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond) // polling for the first counted attempt
	}
	l.kill()
	close(stop)
	cancel() // exchanges cut by the kill would otherwise wait for QUIC's idle timeout
	wg.Wait()
	seen, got := challenged.Load(), joined.Load()

	l.start()
	var after, raceAfter mintedCode
	l.adminJSON(&after, "codes", "show", stormed.ID)
	l.adminJSON(&raceAfter, "codes", "show", raced.ID)
	t.Logf("before the kill: %d wrong-code KE2s seen by agents, %d joins; after restart: storm code %s failedAttempts=%d, race code uses=%d",
		seen, got, after.State, after.FailedAttempts, raceAfter.Uses)
	if seen == 0 {
		t.Fatal("no wrong attempt got through before the kill: the test proves nothing")
	}
	burned := after.State == "revoked" && after.RevokedBy == "system:too-many-attempts"
	if !burned && after.FailedAttempts < int(seen) {
		t.Fatalf("unproven count %d after restart, but agents saw %d counted KE2s", after.FailedAttempts, seen)
	}
	if burned && after.FailedAttempts != 10 {
		t.Fatalf("burned with %d failed attempts", after.FailedAttempts)
	}
	if raceAfter.Uses > raceAfter.MaxUses || raceAfter.Registrations > raceAfter.MaxUses || int(got) > raceAfter.MaxUses {
		t.Fatalf("code exceeded its uses: %+v, %d certificates", raceAfter, got)
	}
	if raceAfter.Registrations < int(got) {
		t.Fatalf("%d certificates handed out but %d registrations recorded", got, raceAfter.Registrations)
	}
	// the listener still works after the crash
	var fresh mintedCode
	l.adminJSON(&fresh, "codes", "create", "--auto-approve", "--max-uses", "1", "--pool", "after-crash")
	if r := agentJoin(context.Background(), l.endpoint, fresh.Code, filepath.Join(dir, "fresh")); r.exit != 0 {
		t.Fatalf("join after restart: %+v", r)
	}
}
