package listener

import (
	"net"
	"net/netip"
	"time"
)

// A source that forges its address can still send Initials: each one
// admitted holds a handshake place, and the listener's half of a
// handshake, until the handshake times out (5 s), and past the bounds it
// holds a place in the backlog and then among the connections let in.
// Honest agents rarely leave a handshake unfinished, so when handshakes
// fail faster than they do, the listener asks every new connection to
// prove its address with a QUIC Retry (RFC 9000 8.1.2) for a while: a
// forged source never sees its Retry, so it gets no handshake and its
// place is given to the next in line at once, while an honest agent
// answers within a round trip and goes before those waiting
// (docs/hardening.md).

const (
	// failuresWithin is how far back handshake failures count.
	failuresWithin = 10 * time.Second
	// failuresToCheck failures within failuresWithin turn the checks on.
	failuresToCheck = 16
	// checkFor is how long the checks stay on after the failures that
	// last kept them on.
	checkFor = time.Minute
	// retryAnswerWait is how long a source asked for a Retry keeps its
	// turn: its answer comes a round trip later, or seconds later from an
	// agent starved of CPU (a herd of 10,000 on two cores, the agents on
	// the listener's machine, left some unanswered after 3 s). While the
	// checks are on, one that does not come counts as a failed handshake,
	// which keeps them on under a flood of forged Initials.
	retryAnswerWait = 10 * time.Second
	// maxRetried bounds the sources remembered as asked for a Retry: a
	// flood of forged Initials would otherwise grow it without end. Past
	// it the oldest is forgotten, and its answer waits its turn.
	maxRetried = defaultBacklog
)

// addressCheck is the state of the address checks: recent failures,
// whether the checks are on, and the sources asked for a Retry whose
// answer is due. The listener's admission lock guards it.
type addressCheck struct {
	// failures are the times of the last failuresToCheck failures,
	// oldest first
	failures []time.Time
	until    time.Time   // the checks are on until then
	retried  sourceTimes // the sources asked for a Retry whose answer is due
}

// on reports whether new connections must prove their address at now.
func (c *addressCheck) on(now time.Time) bool { return now.Before(c.until) }

// failed counts a handshake that never completed, or a Retry never
// answered, and reports whether it turned the checks on.
func (c *addressCheck) failed(now time.Time) (turnedOn bool) {
	if len(c.failures) == failuresToCheck {
		c.failures = append(c.failures[:0], c.failures[1:]...)
	}
	c.failures = append(c.failures, now)
	if len(c.failures) < failuresToCheck || now.Sub(c.failures[0]) > failuresWithin {
		return false
	}
	turnedOn = !c.on(now)
	c.until = now.Add(checkFor)
	return turnedOn
}

// askedRetry notes that src was asked to prove its address.
func (c *addressCheck) askedRetry(src netip.AddrPort, now time.Time) {
	c.retried.dropOldest(func(time.Time) bool { return c.retried.len() >= maxRetried })
	c.retried.add(src, now)
}

// answered reports whether src was asked for a Retry and its answer is
// due, and forgets that it was: its turn is used once.
func (c *addressCheck) answered(src netip.AddrPort) bool { return c.retried.remove(src) }

// expire forgets the Retries asked more than retryAnswerWait ago, and
// reports how many of them were never answered.
func (c *addressCheck) expire(now time.Time) (unanswered int) {
	return c.retried.expire(now, retryAnswerWait)
}

// mustProveAddress is quic-go's VerifySourceAddress: it is asked of each
// new connection's Initial that carries no valid token, and true sends a
// Retry in place of a handshake. A source proves its address when it
// opens connections faster than RetryAbove, and every source does while
// the address checks are on. A source asked for a Retry gives back the
// place the gate took for it, since quic-go admits nothing for it until
// its answer comes; the answer goes before those waiting.
func (l *Listener) mustProveAddress(addr net.Addr) bool {
	retry := l.limiters.overRate(addr)
	a := &l.adm
	now := l.now()
	a.mu.Lock()
	l.expireRetriesLocked(now)
	if !retry && !a.check.on(now) {
		a.mu.Unlock()
		return false
	}
	src := sourceAddrPort(addr)
	freed := a.unreserve(src)
	a.check.askedRetry(src, now)
	a.mu.Unlock()
	l.metrics.retries.Inc()
	if freed {
		l.roomFreed()
	}
	return true
}

// handshakeFailed counts a handshake that ended before it completed.
func (l *Listener) handshakeFailed() {
	l.metrics.handshakeFailures.Inc()
	now := l.now()
	a := &l.adm
	a.mu.Lock()
	turnedOn := a.check.failed(now)
	a.mu.Unlock()
	if turnedOn {
		l.logger.Warn("handshakes are failing: new connections must prove their address with a QUIC Retry", "failedHandshakes", failuresToCheck, "within", failuresWithin, "for", checkFor)
	}
}

// expireRetriesLocked, with the admission lock held, forgets the Retries
// whose answers are overdue and, while the checks are on, counts them as
// failed handshakes. Off, they count for nothing: only a source opening
// connections faster than RetryAbove is asked then, and an honest one
// that is slow to answer must not turn the checks on for everyone.
func (l *Listener) expireRetriesLocked(now time.Time) {
	a := &l.adm
	unanswered := a.check.expire(now)
	if !a.check.on(now) {
		return
	}
	for range unanswered {
		l.metrics.handshakeFailures.Inc()
		a.check.failed(now)
	}
}

// addressChecksOn is the stratum_listener_address_checks gauge.
func (l *Listener) addressChecksOn() float64 {
	a := &l.adm
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.check.on(l.now()) {
		return 1
	}
	return 0
}
