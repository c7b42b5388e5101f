package listener

import (
	"math/rand/v2"
	"net"
	"testing"
	"time"
)

func udpFrom(ip string) net.Addr { return &net.UDPAddr{IP: net.ParseIP(ip), Port: 4242} }

// Forgetting a source whose allowance has refilled changes no answer: over
// a random run of connections from a few sources, with forgets between
// them, the forgetful limiters ask for a Retry exactly when limiters that
// keep every source do; once every allowance has refilled they hold
// nothing.
func TestForgettingRefilledSourcesChangesNoAnswer(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	clock := func() time.Time { return now }
	var forgetful, keeping sourceLimiters
	forgetful.init(3, clock)
	keeping.init(3, clock)
	hosts := []string{"192.0.2.1", "192.0.2.2", "2001:db8::1", "198.51.100.7"}
	rng := rand.New(rand.NewPCG(1, 2))
	retries, forgets := 0, 0
	for i := range 5000 {
		now = now.Add(time.Duration(rng.IntN(120)) * time.Millisecond)
		addr := udpFrom(hosts[rng.IntN(len(hosts))])
		got, want := forgetful.overRate(addr), keeping.overRate(addr)
		if got != want {
			t.Fatalf("connection %d from %s: Retry %v, a limiter that forgets nothing says %v", i, addr, got, want)
		}
		if want {
			retries++
		}
		if rng.IntN(4) == 0 {
			forgetful.forgetRefilled()
			forgets++
		}
	}
	if retries == 0 || retries == 5000 {
		t.Fatalf("%d of 5000 connections asked for a Retry: the run does not test the limit", retries)
	}
	if forgetful.sources.Len() == 0 {
		t.Fatal("no source was over its rate at the end: the run does not test keeping one")
	}
	now = now.Add(2 * time.Second)
	forgetful.forgetRefilled()
	if n := forgetful.sources.Len(); n != 0 {
		t.Fatalf("%d sources kept once every allowance refilled", n)
	}
	t.Logf("%d Retries, %d forgets", retries, forgets)
}

// When a burst's memory is returned the sources whose allowance has
// refilled are forgotten; one still over its rate is kept.
func TestBurstReturnForgetsRefilledSources(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	l := &Listener{}
	l.limiters.init(2, func() time.Time { return now })
	for range 3 {
		l.limiters.overRate(udpFrom("192.0.2.1"))
	}
	now = now.Add(2 * time.Second) // 2 a second: the first has refilled its 3
	l.limiters.overRate(udpFrom("192.0.2.2"))
	for range 4 {
		l.limiters.overRate(udpFrom("192.0.2.3"))
	}
	now = now.Add(100 * time.Millisecond)
	l.burstReturned()
	if n := l.limiters.sources.Len(); n != 2 || l.limiters.sources.Has("192.0.2.1") {
		t.Fatalf("kept %d sources (the refilled one: %v), want the two whose allowance has not refilled", n, l.limiters.sources.Has("192.0.2.1"))
	}
	if !l.limiters.overRate(udpFrom("192.0.2.3")) {
		t.Fatal("a source over its rate was let off the Retry")
	}
}
