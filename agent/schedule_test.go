package agent_test

import (
	"testing"
	"time"

	"github.com/stratumjoin/stratum/agent"
)

func TestBackoff(t *testing.T) {
	base, ceil := time.Second, 4*time.Minute
	for _, tc := range []struct {
		n    int
		r    float64
		want time.Duration
	}{
		{0, 0, 0},
		{0, 0.5, 500 * time.Millisecond},
		{1, 0.5, time.Second},
		{3, 1, 8 * time.Second},
		{7, 1, 128 * time.Second},
		{8, 1, ceil}, // 256s is past the cap
		{8, 0.25, time.Minute},
		{40, 1, ceil}, // no overflow for large attempts
		{63, 0.5, 2 * time.Minute},
		{1 << 20, 1, ceil},
	} {
		if got := agent.Backoff(tc.n, base, ceil, tc.r); got != tc.want {
			t.Errorf("Backoff(%d, r=%v) = %s, want %s", tc.n, tc.r, got, tc.want)
		}
	}
}

func TestRenewTime(t *testing.T) {
	joined := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	life := 7 * 24 * time.Hour
	id := agent.Identity{JoinedAt: joined, NotAfter: joined.Add(life)}
	renewed := joined.Add(3 * 24 * time.Hour)
	again := agent.Identity{JoinedAt: joined, LastRenewal: &renewed, NotAfter: renewed.Add(life)}
	for _, tc := range []struct {
		name string
		id   agent.Identity
		r    float64
		want time.Time
	}{
		{"earliest", id, 0, joined.Add(life * 7 / 12)},
		{"middle", id, 0.5, joined.Add(life * 2 / 3)},
		{"latest", id, 1, joined.Add(life * 3 / 4)},
		{"after a renewal the life counts from it", again, 0.5, renewed.Add(life * 2 / 3)},
	} {
		got := agent.RenewTime(tc.id, tc.r)
		if d := got.Sub(tc.want); d < -time.Second || d > time.Second {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
		if !got.Before(tc.id.NotAfter) {
			t.Errorf("%s: renewal %s not before expiry %s", tc.name, got, tc.id.NotAfter)
		}
	}
}

// TestOverdueWait: an agent that starts past its renewal time spreads its
// renewal over at most a minute, within a quarter of what is left of the
// certificate, and renews at once when that has expired.
func TestOverdueWait(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name string
		left time.Duration
		r    float64
		want time.Duration
	}{
		{"a day left", 24 * time.Hour, 0.5, 30 * time.Second},
		{"a day left, r=1", 24 * time.Hour, 1, time.Minute},
		{"two minutes left", 2 * time.Minute, 1, 30 * time.Second},
		{"expired", -time.Hour, 1, 0},
	} {
		id := agent.Identity{JoinedAt: now.Add(-7 * 24 * time.Hour), NotAfter: now.Add(tc.left)}
		if got := agent.OverdueWait(id, now, tc.r); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
}
