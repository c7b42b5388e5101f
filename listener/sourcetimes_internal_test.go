package listener

import (
	"net/netip"
	"testing"
	"time"
)

// TestSourceTimes: a source added again is kept from its latest time, a
// removed one is not counted when its entry ages out, and expire counts
// only the sources it took out.
func TestSourceTimes(t *testing.T) {
	var s sourceTimes
	t0 := time.Unix(1000, 0)
	a, b, c := netip.MustParseAddrPort("10.0.0.1:1"), netip.MustParseAddrPort("10.0.0.2:1"), netip.MustParseAddrPort("10.0.0.3:1")
	s.add(a, t0)
	s.add(b, t0)
	s.add(c, t0.Add(2*time.Second))
	s.add(a, t0.Add(2*time.Second)) // again, later
	if !s.remove(b) || s.remove(b) {
		t.Fatal("remove b: want true once, then false")
	}
	if n := s.expire(t0.Add(1500*time.Millisecond), time.Second); n != 0 || s.len() != 2 {
		t.Fatalf("expire at 1.5 s: %d taken out, %d left; want none out (b was removed, a added again), a and c left", n, s.len())
	}
	if n := s.expire(t0.Add(3500*time.Millisecond), time.Second); n != 2 || s.len() != 0 || s.has(a) {
		t.Fatalf("expire at 3.5 s: %d taken out, %d left; want a and c out", n, s.len())
	}
	for i := range 5 {
		s.add(netip.AddrPortFrom(netip.MustParseAddr("10.0.1.1"), uint16(i)), t0)
	}
	if n := s.dropOldest(func(time.Time) bool { return s.len() > 3 }); n != 2 || s.len() != 3 {
		t.Fatalf("dropping down to 3: %d dropped, %d left", n, s.len())
	}
}
