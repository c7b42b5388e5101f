package listener

import (
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// wantReturns checks, once every goroutine of the bubble is blocked, that
// the memory was returned want times.
func wantReturns(t *testing.T, returned *atomic.Int32, want int32, when string) {
	t.Helper()
	synctest.Wait()
	if got := returned.Load(); got != want {
		t.Fatalf("returned %d times %s, want %d", got, when, want)
	}
}

// TestMemReturnerReturnsOncePerPause: the memory goes back to the OS one
// second after the last of a burst of schedules, once, and again after
// the next burst.
func TestMemReturnerReturnsOncePerPause(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var returned atomic.Int32
		m := memReturner{before: func() { returned.Add(1) }}
		for range 5 {
			m.schedule()
			time.Sleep(500 * time.Millisecond)
		}
		wantReturns(t, &returned, 0, "during the burst")
		time.Sleep(600 * time.Millisecond)
		wantReturns(t, &returned, 1, "a second after the burst")
		time.Sleep(time.Hour)
		wantReturns(t, &returned, 1, "with nothing scheduled")
		m.schedule()
		time.Sleep(1100 * time.Millisecond)
		wantReturns(t, &returned, 2, "after a second burst")
	})
}

// TestBurstReturnsAfterItsLastConnection: a burst whose memory was
// returned while many of its connections stayed open (joins waiting for
// approval) returns it again once the last of them ends.
func TestBurstReturnsAfterItsLastConnection(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var returned atomic.Int32
		l := &Listener{}
		l.burstMem.before = func() {
			l.burstReturned()
			returned.Add(1)
		}
		for range 100 {
			l.connStarted()
		}
		for range 10 { // ten end, ninety wait on
			l.connEnded()
		}
		time.Sleep(1100 * time.Millisecond)
		wantReturns(t, &returned, 1, "a second after ten ended")
		for range 90 {
			l.connEnded()
		}
		time.Sleep(1100 * time.Millisecond)
		wantReturns(t, &returned, 2, "a second after the last ended")
		// a trickle after the burst returns nothing
		l.connStarted()
		l.connEnded()
		time.Sleep(time.Hour)
		wantReturns(t, &returned, 2, "after one more connection")
	})
}
