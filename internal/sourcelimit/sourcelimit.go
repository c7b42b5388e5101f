// Package sourcelimit keeps a token-bucket allowance per source address,
// for the listener's Retry threshold and the admin API's failed-key limit.
// A source whose allowance has refilled answers as an unseen one would, so
// it can be forgotten at any time without changing an answer; that is how
// the set stays small after a herd or a scan.
package sourcelimit

import (
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Sources holds the allowances: Limit a second, Burst at most. The zero
// value is not usable; set both.
type Sources struct {
	Limit rate.Limit
	Burst int

	mu sync.Mutex
	m  map[string]*rate.Limiter
}

// Spend takes one from src's allowance at now and reports whether there
// was one to take.
func (s *Sources) Spend(src string, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	lim := s.m[src]
	if lim == nil {
		if s.m == nil {
			s.m = map[string]*rate.Limiter{}
		}
		lim = rate.NewLimiter(s.Limit, s.Burst)
		s.m[src] = lim
	}
	return lim.AllowN(now, 1)
}

// Tokens is what is left of src's allowance at now: Burst for a source not
// seen (or forgotten).
func (s *Sources) Tokens(src string, now time.Time) float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if lim := s.m[src]; lim != nil {
		return lim.TokensAt(now)
	}
	return float64(s.Burst)
}

// ForgetRefilled drops the sources whose allowance has refilled by now.
// The map is rebuilt, as a Go map never shrinks.
func (s *Sources) ForgetRefilled(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var kept map[string]*rate.Limiter
	for src, lim := range s.m {
		if lim.TokensAt(now) < float64(lim.Burst()) {
			if kept == nil {
				kept = map[string]*rate.Limiter{}
			}
			kept[src] = lim
		}
	}
	s.m = kept
}

// Len is how many sources are kept.
func (s *Sources) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m)
}

// Has reports whether src is kept.
func (s *Sources) Has(src string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[src] != nil
}
