// Package gcfloor keeps a long-running server's garbage collector from
// running more often than once per Headroom bytes allocated while its live
// heap is small.
//
// With GOGC=100 the collector runs each time the heap doubles, and a heap
// of a few MiB doubles every few requests: the listener's live heap is
// about 5 MiB when it is not under a herd, and each join allocates about
// 230 KiB, so it collected every ~20 joins and spent about a tenth of its
// CPU doing so. After every cycle the tuner sets GOGC so that the next one
// comes once the heap has grown by max(live heap, min(Headroom, 4x live)):
// at most Headroom more memory than GOGC=100 while the live heap is small, and
// exactly GOGC=100 once it is larger than Headroom, so the peak under a
// herd (where the live heap is largest) is what GOGC=100 gives.
package gcfloor

import (
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"sync/atomic"
)

// DefaultHeadroom is the listener's default: a few hundred joins between
// collections, for at most 32 MiB more heap than GOGC=100 at rest.
const DefaultHeadroom = 32 << 20

// maxPercent bounds GOGC when the live heap is tiny (a fresh process).
const maxPercent = 400

// Tuner adjusts GOGC after each garbage collection. The zero value is not
// usable; call Start.
type Tuner struct {
	headroom uint64
	stopped  atomic.Bool
	percent  atomic.Int64
	// onTune, when set, is told each GOGC the tuner sets (tests).
	onTune  func(percent int)
	samples []metrics.Sample
	mu      sync.Mutex
}

// sentinel is garbage the moment it is made: its finalizer runs after the
// next collection, tunes, and makes the next sentinel. It holds a pointer
// so the allocator never packs it with other small objects, whose sharing
// would delay its finalizer.
type sentinel struct{ t *Tuner }

// Start tunes GOGC after every collection until Stop, unless the operator
// set GOGC or GOMEMLIMIT (their choice stands): then it returns nil.
// headroom 0 means DefaultHeadroom.
func Start(headroom uint64) *Tuner {
	if os.Getenv("GOGC") != "" || os.Getenv("GOMEMLIMIT") != "" {
		return nil
	}
	return start(headroom, nil)
}

func start(headroom uint64, onTune func(int)) *Tuner {
	if headroom == 0 {
		headroom = DefaultHeadroom
	}
	t := &Tuner{headroom: headroom, onTune: onTune, samples: []metrics.Sample{{Name: "/gc/heap/live:bytes"}}}
	t.percent.Store(100)
	t.tune()
	t.arm()
	return t
}

func (t *Tuner) arm() {
	runtime.SetFinalizer(&sentinel{t: t}, func(s *sentinel) {
		if s.t.stopped.Load() {
			return
		}
		s.t.tune()
		s.t.arm()
	})
}

// Percent is the GOGC the tuner set last.
func (t *Tuner) Percent() int { return int(t.percent.Load()) }

// Stop ends the tuning and puts GOGC back to 100.
func (t *Tuner) Stop() {
	if t == nil || t.stopped.Swap(true) {
		return
	}
	debug.SetGCPercent(100)
}

func (t *Tuner) tune() {
	t.mu.Lock()
	defer t.mu.Unlock()
	metrics.Read(t.samples)
	live := t.samples[0].Value.Uint64()
	p := PercentFor(live, t.headroom)
	if old := t.percent.Load(); p != int(old) {
		debug.SetGCPercent(p)
		t.percent.Store(int64(p))
	}
	if t.onTune != nil {
		t.onTune(p)
	}
}

// PercentFor is the GOGC that makes the next collection come once a heap
// of live bytes has grown by max(live, headroom): 100 once live reaches
// headroom, more below it, at most maxPercent (growth 4x live).
func PercentFor(live, headroom uint64) int {
	if live >= headroom {
		return 100
	}
	if live == 0 || headroom/live >= maxPercent/100 {
		return maxPercent
	}
	return int(headroom * 100 / live)
}
