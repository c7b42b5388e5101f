package pki_test

import (
	"regexp"
	"testing"

	"github.com/stratumjoin/stratum/pki"
)

var nodeIDPattern = regexp.MustCompile(`^node-[0-9a-hjkmnp-tv-z]{26}$`)

func TestNodeIDFormatAndUniqueness(t *testing.T) {
	const draws = 10000
	seen := make(map[string]bool, draws)
	firstSymbols := map[byte]bool{}
	lastSymbols := map[byte]bool{}
	for range draws {
		id, err := pki.NodeID()
		if err != nil {
			t.Fatal(err)
		}
		if !nodeIDPattern.MatchString(id) {
			t.Fatalf("node id %q does not match %s", id, nodeIDPattern)
		}
		if !pki.ValidNodeID(id) {
			t.Fatalf("ValidNodeID(%q) = false for a fresh id", id)
		}
		if seen[id] {
			t.Fatalf("node id %q drawn twice", id)
		}
		seen[id] = true
		firstSymbols[id[5]] = true
		lastSymbols[id[len(id)-1]] = true
	}
	// All 130 bits are random: the first and last symbols take all 32
	// values (each misses one in 10,000 draws with probability ~1e-135).
	if len(firstSymbols) != 32 || len(lastSymbols) != 32 {
		t.Errorf("first symbol took %d values, last %d; want 32 each", len(firstSymbols), len(lastSymbols))
	}
}

func TestValidNodeID(t *testing.T) {
	tests := []struct {
		in string
		ok bool
	}{
		{"node-0123456789abcdefghjkmnpqrs", true},
		{"node-tvwxyz00000000000000000000", true},
		{"node-0123456789ABCDEFGHJKMNPQRS", false}, // upper case is not canonical
		{"node-0123456789abcdefghjkmnpqri", false}, // i
		{"node-0123456789abcdefghjkmnpqrl", false}, // l
		{"node-0123456789abcdefghjkmnpqro", false}, // o
		{"node-0123456789abcdefghjkmnpqru", false}, // u
		{"node-0123456789abcdefghjkmnpqr", false},  // 25 symbols
		{"node-0123456789abcdefghjkmnpqrst", false},
		{"Node-0123456789abcdefghjkmnpqrs", false},
		{"nodes0123456789abcdefghjkmnpqrs", false},
		{"node-0123456789abcdefghjkmnpq/s", false},
		{"", false},
	}
	for _, tt := range tests {
		if got := pki.ValidNodeID(tt.in); got != tt.ok {
			t.Errorf("ValidNodeID(%q) = %v, want %v", tt.in, got, tt.ok)
		}
	}
}
