package listener

import (
	"net"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// sourceLimiters asks sources that open connections faster than
// perSecond to prove their address with a Retry (docs/hardening.md).
type sourceLimiters struct {
	perSecond float64
	now       func() time.Time
	mu        sync.Mutex
	m         map[string]*rate.Limiter
}

func (s *sourceLimiters) overRate(addr net.Addr) bool {
	host := addr.String()
	if ua, ok := addr.(*net.UDPAddr); ok {
		host = ua.IP.String()
	}
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[string]*rate.Limiter{}
	}
	lim := s.m[host]
	if lim == nil {
		lim = rate.NewLimiter(rate.Limit(s.perSecond), int(s.perSecond)+1)
		s.m[host] = lim
	}
	return !lim.AllowN(now, 1)
}

// forgetRefilled drops the sources whose allowance has refilled: a full
// limiter answers as a new one would, so keeping it only holds memory (a
// herd of 10,000 machines left as many, scattered through the heap). The
// map is rebuilt, as a Go map never shrinks.
func (s *sourceLimiters) forgetRefilled() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.m) == 0 {
		return
	}
	now := s.now()
	var kept map[string]*rate.Limiter
	for host, lim := range s.m {
		if lim.TokensAt(now) < float64(lim.Burst()) {
			if kept == nil {
				kept = map[string]*rate.Limiter{}
			}
			kept[host] = lim
		}
	}
	s.m = kept
}
