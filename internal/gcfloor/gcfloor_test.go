package gcfloor

import (
	"runtime"
	"runtime/metrics"
	"testing"
	"time"
)

func TestPercentFor(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		live, headroom uint64
		want           int
	}{
		{5 * mib, 32 * mib, maxPercent},
		{10 * mib, 32 * mib, 320},
		{16 * mib, 32 * mib, 200},
		{32 * mib, 32 * mib, 100},
		{66 * mib, 32 * mib, 100},
		{1 * mib, 32 * mib, maxPercent},
		{0, 32 * mib, maxPercent},
	} {
		if got := PercentFor(tc.live, tc.headroom); got != tc.want {
			t.Errorf("PercentFor(%d MiB, %d MiB) = %d, want %d", tc.live/mib, tc.headroom/mib, got, tc.want)
		}
	}
}

func read(name string) uint64 {
	s := []metrics.Sample{{Name: name}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// collect runs collections until the tuner answers one with a GOGC that
// ok accepts (a collection the allocations themselves started may answer
// first), at most five, and returns the last GOGC it set.
func collect(t *testing.T, tuned <-chan int, ok func(int) bool) int {
	t.Helper()
	var p int
	for range 5 {
		runtime.GC()
		select {
		case p = <-tuned:
		case <-time.After(10 * time.Second):
			t.Fatal("the tuner did not run after a collection")
		}
		if ok(p) {
			break
		}
	}
	return p
}

var keep [][]byte

// TestSmallHeapGetsHeadroom: after a collection of a small heap the
// collector's goal is raised past GOGC=100's; a live heap above the
// headroom gets GOGC=100; Stop puts 100 back.
func TestSmallHeapGetsHeadroom(t *testing.T) {
	const headroom = 64 << 20
	tuned := make(chan int, 16)
	tu := start(headroom, func(p int) {
		select {
		case tuned <- p:
		default:
		}
	})
	defer tu.Stop()
	<-tuned // the tune at start
	p := collect(t, tuned, func(p int) bool { return p > 100 })
	live, goal := read("/gc/heap/live:bytes"), read("/gc/heap/goal:bytes")
	if p <= 100 {
		t.Fatalf("GOGC %d for a live heap of %d bytes, want more than 100", p, live)
	}
	// the runtime's goal for GOGC=p: live grown by p %, and never under
	// its 4 MiB minimum heap scaled by p % (GOGC=100 would give 4 MiB here)
	if want := max(live+live*uint64(p)/100, (4<<20)*uint64(p)/100); goal < want*9/10 {
		t.Errorf("heap goal %d bytes for %d live at GOGC %d, want about %d", goal, live, p, want)
	}

	// a live heap twice the headroom collects as GOGC=100 does
	for range 2 * headroom >> 20 {
		keep = append(keep, make([]byte, 1<<20))
	}
	defer func() { keep = nil }()
	if p := collect(t, tuned, func(p int) bool { return p == 100 }); p != 100 {
		t.Errorf("GOGC %d with %d bytes live, want 100", p, read("/gc/heap/live:bytes"))
	}
	tu.Stop()
	if tu.Percent() != 100 {
		t.Errorf("Percent %d after Stop", tu.Percent())
	}
}

// TestOperatorsGOGCStands: with GOGC or GOMEMLIMIT set there is no tuner.
func TestOperatorsGOGCStands(t *testing.T) {
	for _, env := range []string{"GOGC", "GOMEMLIMIT"} {
		t.Run(env, func(t *testing.T) {
			t.Setenv(env, "200")
			if tu := Start(0); tu != nil {
				tu.Stop()
				t.Fatalf("a tuner started with %s set", env)
			}
		})
	}
}
