package agent_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stratumjoin/stratum/agent"
	"github.com/stratumjoin/stratum/listener"
	"github.com/stratumjoin/stratum/listener/adminapi"
	"github.com/stratumjoin/stratum/listener/listenertest"
)

// TestRunHerdAgainstListenerThatIsDown starts 100 agents against a
// listener that is down and brings it up 1.5s later: their retries are
// spread by full jitter rather than arriving together, and all of them
// join with one code without burning it. Their renewal times, computed
// from the identities they got, are spread too.
func TestRunHerdAgainstListenerThatIsDown(t *testing.T) {
	const (
		agents = 100
		base   = 250 * time.Millisecond
		ceil   = 2 * time.Second
		downed = 1500 * time.Millisecond
	)
	// Mint with the listener up, then take it down: its port is the one
	// the agents dial, and nothing answers there until it comes back.
	first := listenertest.Start(t, listenertest.Options{})
	sec, code := mintCode(t, first, adminapi.MintCodeRequest{AutoApprove: true, MaxUses: unlimited()})
	endpoint, dataDir := first.Endpoint, first.DataDir
	first.Stop()

	type retry struct {
		agent, attempt int
		wait           time.Duration
		at             time.Duration // since the agents started
	}
	var mu sync.Mutex
	var retries []retry
	start := time.Now()
	var as []*runningAgent
	for i := range agents {
		as = append(as, startAgent(t, endpoint, sec, filepath.Join(t.TempDir(), fmt.Sprint("a", i)), nil, func(c *agent.RunConfig) {
			c.BackoffBase, c.BackoffMax = base, ceil
			c.JoinConfig = func(j *agent.JoinConfig) { j.DialTimeout = 300 * time.Millisecond }
			c.OnRetry = func(attempt int, wait time.Duration, _ error) {
				mu.Lock()
				retries = append(retries, retry{i, attempt, wait, time.Since(start)})
				mu.Unlock()
			}
		}))
	}

	time.Sleep(downed) // the listener is down this long: the outage the agents back off through
	pc, err := net.ListenPacket("udp", endpoint)
	if err != nil {
		t.Fatal(err)
	}
	// 100 agents behind one address: the listener is set up as
	// docs/hardening.md says for such a site
	l := listenertest.Start(t, listenertest.Options{DataDir: dataDir, Config: listener.Config{PacketConn: pc, PerSourceConnections: -1, UnprovenPerSource: 128, UnprovenPerPrefix: 128}})
	up := time.Since(start)
	var joinedAt []time.Duration
	for _, a := range as {
		a.waitReady(t, 90*time.Second)
		joinedAt = append(joinedAt, time.Since(start))
	}
	t.Logf("listener up at %s; last of %d agents READY by %s", up.Round(time.Millisecond), agents, slices.Max(joinedAt).Round(time.Millisecond))

	mu.Lock()
	defer mu.Unlock()
	// First retry of each agent: its wait is uniform in [0, base).
	var firstWaits []float64
	retried := map[int]bool{}
	for _, r := range retries {
		if r.attempt == 0 {
			firstWaits = append(firstWaits, float64(r.wait)/float64(base))
		}
		retried[r.agent] = true
	}
	if len(retried) != agents {
		t.Fatalf("%d of %d agents retried while the listener was down", len(retried), agents)
	}
	hist, used := histogram(firstWaits, 0, 1, 10)
	mean, sd := meanStddev(firstWaits)
	t.Logf("first-retry waits (fraction of the %s ceiling), %d agents; mean %.2f, stddev %.2f (uniform: 0.50, 0.29):\n%s", base, len(firstWaits), mean, sd, hist)
	if used < 5 || sd < 0.15 {
		t.Errorf("first-retry waits bunched: %d of 10 buckets used, stddev %.2f of the ceiling", used, sd)
	}
	// When the retried dials went out, while the listener was down.
	var dials []float64
	for _, r := range retries {
		if d := r.at + r.wait; d < up {
			dials = append(dials, d.Seconds())
		}
	}
	buckets := int(up / (100 * time.Millisecond))
	hist, used = histogram(dials, 0, float64(buckets)/10, buckets)
	t.Logf("retried dials while the listener was down (s since start, 100ms buckets), %d dials:\n%s", len(dials), hist)
	if used < buckets/2 {
		t.Errorf("retried dials bunched into %d of %d buckets", used, buckets)
	}

	// One code, 100 joins: not burned, no use lost or doubled.
	c, err := l.Admin.Code(context.Background(), code.ID)
	if err != nil {
		t.Fatal(err)
	}
	if c.State != "live" || c.Uses != agents || c.Registrations != agents {
		t.Fatalf("code after the herd: %+v", c)
	}
	t.Logf("code after the herd: uses %d, failed attempts %d", c.Uses, c.FailedAttempts)

	// Renewal times of the 100 joined identities, with real randomness.
	ids := map[string]bool{}
	var fracs []float64
	var spanMin, spanMax time.Time
	for i, a := range as {
		id := a.identity(t)
		ids[id.NodeID] = true
		at := agent.RenewTime(id, rand.Float64())
		life := id.NotAfter.Sub(id.JoinedAt)
		if !at.Before(id.NotAfter) || at.Before(id.JoinedAt.Add(life/2)) {
			t.Errorf("agent %d: renewal at %s for a certificate valid %s..%s", i, at, id.JoinedAt, id.NotAfter)
		}
		fracs = append(fracs, float64(at.Sub(id.JoinedAt))/float64(life))
		if spanMin.IsZero() || at.Before(spanMin) {
			spanMin = at
		}
		if at.After(spanMax) {
			spanMax = at
		}
	}
	if len(ids) != agents {
		t.Fatalf("%d distinct node ids for %d agents", len(ids), agents)
	}
	mean, sd = meanStddev(fracs)
	hist, used = histogram(fracs, 7.0/12, 9.0/12, 10)
	t.Logf("renewal times of %d agents (fraction of the certificate's life): min %.3f max %.3f mean %.3f stddev %.3f; span %s:\n%s",
		agents, slices.Min(fracs), slices.Max(fracs), mean, sd, spanMax.Sub(spanMin).Round(time.Minute), hist)
	if sd < 0.01 || used < 5 {
		t.Errorf("renewals in lockstep: stddev %.4f of the life, %d of 10 buckets", sd, used)
	}
}

// histogram draws values in [lo, hi) as n text bars; it returns the text
// and how many buckets are not empty.
func histogram(vs []float64, lo, hi float64, n int) (string, int) {
	counts := make([]int, n)
	for _, v := range vs {
		i := int((v - lo) / (hi - lo) * float64(n))
		i = min(max(i, 0), n-1)
		counts[i]++
	}
	var b strings.Builder
	used := 0
	for i, c := range counts {
		if c > 0 {
			used++
		}
		w := (hi - lo) / float64(n)
		fmt.Fprintf(&b, "  [%6.3f, %6.3f) %3d %s\n", lo+float64(i)*w, lo+float64(i+1)*w, c, strings.Repeat("#", c))
	}
	return b.String(), used
}

func meanStddev(vs []float64) (mean, sd float64) {
	for _, v := range vs {
		mean += v
	}
	mean /= float64(len(vs))
	for _, v := range vs {
		sd += (v - mean) * (v - mean)
	}
	return mean, math.Sqrt(sd / float64(len(vs)))
}
