package listener

import (
	"net/netip"
	"time"
)

// sourceTimes is a set of sources, each with when it was added, that
// forgets them oldest first: the places the gate took for connections it
// let in, and the sources asked for a Retry. It is not safe for
// concurrent use: the admission lock guards it.
type sourceTimes struct {
	at    map[netip.AddrPort]time.Time
	order []sourceTime // oldest first; an entry re-added or removed since stays until it ages out
}

type sourceTime struct {
	src netip.AddrPort
	at  time.Time
}

func (s *sourceTimes) len() int { return len(s.at) }

func (s *sourceTimes) has(src netip.AddrPort) bool {
	_, ok := s.at[src]
	return ok
}

// add puts src in the set as of now, again if it was in it.
func (s *sourceTimes) add(src netip.AddrPort, now time.Time) {
	if s.at == nil {
		s.at = map[netip.AddrPort]time.Time{}
	}
	s.at[src] = now
	s.order = append(s.order, sourceTime{src, now})
}

// remove takes src out of the set, reporting whether it was in it.
func (s *sourceTimes) remove(src netip.AddrPort) bool {
	if !s.has(src) {
		return false
	}
	delete(s.at, src)
	if len(s.at) == 0 {
		s.order = nil
	}
	return true
}

// dropOldest forgets entries, oldest first, while keep says to go on and
// some are left; it returns how many sources it took out of the set.
func (s *sourceTimes) dropOldest(keep func(at time.Time) bool) (dropped int) {
	for len(s.order) > 0 && keep(s.order[0].at) {
		e := s.order[0]
		s.order = s.order[1:]
		if at, ok := s.at[e.src]; ok && at.Equal(e.at) {
			delete(s.at, e.src)
			dropped++
		}
	}
	if len(s.order) == 0 {
		s.order = nil
	}
	return dropped
}

// expire forgets the sources added more than ttl before now, and returns
// how many.
func (s *sourceTimes) expire(now time.Time, ttl time.Duration) int {
	return s.dropOldest(func(at time.Time) bool { return now.Sub(at) > ttl })
}
