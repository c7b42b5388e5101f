package listener

import (
	"fmt"
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
			l.connEnded(0)
		}
		time.Sleep(1100 * time.Millisecond)
		wantReturns(t, &returned, 1, "a second after ten ended")
		for range 90 {
			l.connEnded(0)
		}
		time.Sleep(1100 * time.Millisecond)
		wantReturns(t, &returned, 2, "a second after the last ended")
		// a trickle after the burst returns nothing
		l.connStarted()
		l.connEnded(0)
		time.Sleep(time.Hour)
		wantReturns(t, &returned, 2, "after one more connection")
	})
}

// TestBurstReturnsAgainOnceQUICLetsGo: connections whose closed state
// quic-go keeps for longer than the pause (three probe timeouts of a slow
// peer) have their memory returned again once that has passed and the
// pause after it, and every 10 s until then; state held for less than the
// pause is returned with the first.
func TestBurstReturnsAgainOnceQUICLetsGo(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var returned atomic.Int32
		l := &Listener{}
		l.burstMem.before = func() { returned.Add(1) }
		for range 100 {
			l.connStarted()
		}
		for i := range 100 {
			l.connEnded(time.Duration(i) * 100 * time.Millisecond) // the last held 9.9 s
		}
		time.Sleep(1100 * time.Millisecond)
		wantReturns(t, &returned, 1, "a second after the last ended")
		time.Sleep(9700 * time.Millisecond) // 10.8 s: the last let go at 9.9 s, the pause after it ends at 10.9 s
		wantReturns(t, &returned, 1, "before quic-go's hold and its pause passed")
		time.Sleep(200 * time.Millisecond)
		wantReturns(t, &returned, 2, "once quic-go let go of the last")
		time.Sleep(time.Hour)
		wantReturns(t, &returned, 2, "with nothing held")

		// held for 25 s: returned at 1 s, then every 10 s, and at 26 s
		for range 100 {
			l.connStarted()
		}
		for range 100 {
			l.connEnded(25 * time.Second)
		}
		ended := time.Now()
		want := int32(2)
		for _, at := range []time.Duration{1, 11, 21, 26} {
			time.Sleep(time.Until(ended.Add(at*time.Second - 100*time.Millisecond)))
			wantReturns(t, &returned, want, fmt.Sprintf("just before %v", at*time.Second))
			time.Sleep(200 * time.Millisecond)
			want++
			wantReturns(t, &returned, want, fmt.Sprintf("just after %v", at*time.Second))
		}
		time.Sleep(time.Hour)
		wantReturns(t, &returned, want, "once nothing is held")

		for range 100 {
			l.connStarted()
		}
		for range 100 {
			l.connEnded(600 * time.Millisecond)
		}
		time.Sleep(time.Hour)
		wantReturns(t, &returned, want+1, "after a burst held for less than the pause")
	})
}

// closedHold follows quic-go's probe timeout: three of them, and at least
// three of the 200 ms it uses before any RTT sample.
func TestClosedHoldIsThreeProbeTimeouts(t *testing.T) {
	for _, c := range []struct {
		srtt, dev, want time.Duration
	}{
		{time.Millisecond, 0, 600 * time.Millisecond},
		{time.Second, 250 * time.Millisecond, 6 * time.Second},
		{2 * time.Second, 0, 3 * (2*time.Second + time.Millisecond)},
	} {
		if got := ptoHold(c.srtt, c.dev); got != c.want {
			t.Errorf("smoothed RTT %v, deviation %v: held %v, want %v", c.srtt, c.dev, got, c.want)
		}
	}
}
