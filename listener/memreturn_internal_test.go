package listener

import (
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

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
		synctest.Wait()
		if returned.Load() != 0 {
			t.Fatalf("returned %d times during the burst, want 0", returned.Load())
		}
		time.Sleep(600 * time.Millisecond)
		synctest.Wait()
		if returned.Load() != 1 {
			t.Fatalf("returned %d times a second after the burst, want 1", returned.Load())
		}
		time.Sleep(time.Hour)
		synctest.Wait()
		if returned.Load() != 1 {
			t.Fatalf("returned %d times with nothing scheduled, want 1", returned.Load())
		}
		m.schedule()
		time.Sleep(1100 * time.Millisecond)
		synctest.Wait()
		if returned.Load() != 2 {
			t.Fatalf("returned %d times after a second burst, want 2", returned.Load())
		}
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
		synctest.Wait()
		if returned.Load() != 1 {
			t.Fatalf("returned %d times a second after ten ended, want 1", returned.Load())
		}
		for range 90 {
			l.connEnded()
		}
		time.Sleep(1100 * time.Millisecond)
		synctest.Wait()
		if returned.Load() != 2 {
			t.Fatalf("returned %d times a second after the last ended, want 2", returned.Load())
		}
		// a trickle after the burst returns nothing
		l.connStarted()
		l.connEnded()
		time.Sleep(time.Hour)
		synctest.Wait()
		if returned.Load() != 2 {
			t.Fatalf("returned %d times after one more connection, want 2", returned.Load())
		}
	})
}
