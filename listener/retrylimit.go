package listener

import (
	"net"
	"time"

	"golang.org/x/time/rate"

	"github.com/stratumjoin/stratum/internal/sourcelimit"
)

// sourceLimiters asks sources that open connections faster than
// perSecond to prove their address with a Retry (docs/hardening.md).
type sourceLimiters struct {
	sources sourcelimit.Sources
	now     func() time.Time
}

func (s *sourceLimiters) init(perSecond float64, now func() time.Time) {
	s.sources.Limit, s.sources.Burst, s.now = rate.Limit(perSecond), int(perSecond)+1, now
}

func (s *sourceLimiters) clock() time.Time {
	if s.now == nil { // a Listener made without New, in a test
		return time.Now()
	}
	return s.now()
}

func (s *sourceLimiters) overRate(addr net.Addr) bool {
	host := addr.String()
	if ua, ok := addr.(*net.UDPAddr); ok {
		host = ua.IP.String()
	}
	return !s.sources.Spend(host, s.clock())
}

// forgetRefilled drops the sources whose allowance has refilled: a herd
// of 10,000 machines left as many, scattered through the heap.
func (s *sourceLimiters) forgetRefilled() { s.sources.ForgetRefilled(s.clock()) }
