package listener

import (
	"bytes"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// withChecks gives g's listener what the address checks use: a logger
// (into logs) and a Retry threshold no source reaches.
func (g *gateTest) withChecks(logs *bytes.Buffer) *gateTest {
	g.l.logger = slog.New(slog.NewTextHandler(logs, nil))
	g.l.limiters.init(1e6, func() time.Time { return g.now })
	return g
}

func (g *gateTest) failures(t *testing.T) float64 {
	t.Helper()
	var m dto.Metric
	if err := g.l.metrics.handshakeFailures.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// TestAddressChecksFollowFailedHandshakes: 16 handshakes failed within
// 10 s make every new connection prove its address, with one warning,
// for a minute after the last of them; as many spread wider do not.
func TestAddressChecksFollowFailedHandshakes(t *testing.T) {
	var logs bytes.Buffer
	g := newGateTest(100, 100, 10).withChecks(&logs)
	l := g.l
	a := udpAddr("10.0.0.1", 1)
	if l.mustProveAddress(a) {
		t.Fatal("a Retry asked with no failed handshake")
	}
	// sixteen, one a second: never sixteen within 10 s
	for range failuresToCheck {
		l.handshakeFailed()
		g.now = g.now.Add(time.Second)
	}
	if l.mustProveAddress(a) || l.addressChecksOn() != 0 {
		t.Fatal("checks on after failures spread over 16 s")
	}
	g.now = g.now.Add(failuresWithin)
	for range failuresToCheck - 1 {
		l.handshakeFailed()
	}
	if l.mustProveAddress(a) {
		t.Fatal("checks on after 15 failures at once")
	}
	l.handshakeFailed()
	l.handshakeFailed()
	if !l.mustProveAddress(udpAddr("10.0.0.2", 1)) || l.addressChecksOn() != 1 {
		t.Fatal("no Retry asked after 17 failures at once")
	}
	if n := strings.Count(logs.String(), "must prove their address"); n != 1 {
		t.Fatalf("%d warnings, want one as the checks went on:\n%s", n, logs.String())
	}
	g.now = g.now.Add(checkFor - time.Second)
	if !l.mustProveAddress(udpAddr("10.0.0.3", 1)) {
		t.Fatal("checks off before a minute passed")
	}
	g.now = g.now.Add(2 * time.Second)
	if l.mustProveAddress(udpAddr("10.0.0.4", 1)) || l.addressChecksOn() != 0 {
		t.Fatal("checks still on a minute after the last failure")
	}
}

// TestRetryGivesThePlaceToTheNext: a connection let in and asked for a
// Retry gives its place to the next waiter at once, its answer goes
// before the others waiting, and a Retry never answered counts as a
// failed handshake.
func TestRetryGivesThePlaceToTheNext(t *testing.T) {
	var logs bytes.Buffer
	g := newGateTest(100, 1, 10).withChecks(&logs)
	l := g.l
	for range failuresToCheck {
		l.handshakeFailed()
	}
	a, b, c := udpAddr("10.0.0.1", 1), udpAddr("10.0.0.2", 1), udpAddr("10.0.0.3", 1)
	if !l.passInitial(initial("a1", a)) {
		t.Fatal("first connection held")
	}
	if l.passInitial(initial("b1", b)) || l.passInitial(initial("c1", c)) {
		t.Fatal("connections passed a handshake bound of 1")
	}
	// quic-go asks whether a must prove its address: it must, and its
	// place goes to b
	if !l.mustProveAddress(a) {
		t.Fatal("no Retry asked of a while the checks are on")
	}
	if !slices.Equal(g.letIn, []string{"b1"}) {
		t.Fatalf("after a's Retry, let in %q, want b", g.letIn)
	}
	// a answers while b holds the place: it waits, before c
	if l.passInitial(initial("a2", a)) {
		t.Fatal("a's answer passed while b held the only place")
	}
	if !l.mustProveAddress(b) {
		t.Fatal("no Retry asked of b")
	}
	if !slices.Equal(g.letIn, []string{"b1", "a2"}) {
		t.Fatalf("after b's Retry, let in %q, want a's answer before c", g.letIn)
	}
	g.admit(a) // its token is valid: quic-go asks nothing more
	before := g.failures(t)
	// b never answers
	g.now = g.now.Add(retryAnswerWait + time.Millisecond)
	l.passInitial(initial("d1", udpAddr("10.0.0.4", 1)))
	if got := g.failures(t) - before; got != 1 {
		t.Fatalf("%v failures counted for b's unanswered Retry, want 1", got)
	}
}

// TestUnansweredRetryOffCountsNothing: with the checks off, only a source
// over RetryAbove is asked for a Retry, and one slow to answer (an agent
// starved of CPU) does not count as a failed handshake.
func TestUnansweredRetryOffCountsNothing(t *testing.T) {
	var logs bytes.Buffer
	g := newGateTest(100, 100, 10).withChecks(&logs)
	l := g.l
	l.limiters.init(1, func() time.Time { return g.now })
	a := udpAddr("10.0.0.1", 1)
	asked := 0
	for range 3 {
		if l.mustProveAddress(a) {
			asked++
		}
	}
	if asked != 1 {
		t.Fatalf("%d of 3 connections at once asked for a Retry with RetryAbove 1, want the third", asked)
	}
	g.now = g.now.Add(retryAnswerWait + time.Millisecond)
	l.passInitial(initial("b1", udpAddr("10.0.0.2", 1)))
	if got := g.failures(t); got != 0 || l.addressChecksOn() != 0 {
		t.Fatalf("an unanswered Retry with the checks off: %v failures, checks %v; want none", got, l.addressChecksOn())
	}
}
