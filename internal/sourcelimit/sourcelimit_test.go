package sourcelimit

import (
	"testing"
	"time"
)

// A source spends its burst, refills at its rate, and is forgotten only
// once full again; an unseen or forgotten source has its whole burst.
func TestSpendRefillForget(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	s := &Sources{Limit: 2, Burst: 3}
	if got := s.Tokens("a", now); got != 3 {
		t.Fatalf("unseen source: %v tokens, want 3", got)
	}
	for i := range 3 {
		if !s.Spend("a", now) {
			t.Fatalf("spend %d of a burst of 3 refused", i+1)
		}
	}
	if s.Spend("a", now) {
		t.Fatal("a fourth spend at once allowed")
	}
	s.Spend("b", now)
	now = now.Add(time.Second) // a: 2 of 3 back; b: full again
	s.ForgetRefilled(now)
	if s.Len() != 1 || !s.Has("a") || s.Has("b") {
		t.Fatalf("kept %d (a %v, b %v), want only a", s.Len(), s.Has("a"), s.Has("b"))
	}
	if got := s.Tokens("a", now); got != 2 {
		t.Fatalf("a after a second: %v tokens, want 2", got)
	}
	now = now.Add(time.Second)
	s.ForgetRefilled(now)
	if s.Len() != 0 || s.Tokens("a", now) != 3 {
		t.Fatalf("after refilling: kept %d, a has %v", s.Len(), s.Tokens("a", now))
	}
}
