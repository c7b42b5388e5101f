package listener_test

import (
	"testing"

	"github.com/stratumjoin/stratum/listener"
)

// ServingGC raises GOGC and bounds the heap by the connection bounds,
// unless the environment set either.
func TestServingGC(t *testing.T) {
	t.Setenv("GOGC", "")
	t.Setenv("GOMEMLIMIT", "")
	small := listener.ServingGC(listener.Config{MaxConnections: 10, MaxRenewals: 10})
	big := listener.ServingGC(listener.Config{MaxConnections: 4096, MaxRenewals: 512})
	if small.Percent <= 100 || big.Percent != small.Percent {
		t.Fatalf("gc percent %d and %d, want the same, above 100", small.Percent, big.Percent)
	}
	if small.Limit <= 0 || big.Limit <= small.Limit {
		t.Fatalf("memory limits %d and %d: want a positive one that grows with the connections", small.Limit, big.Limit)
	}
	t.Setenv("GOGC", "50")
	t.Setenv("GOMEMLIMIT", "1GiB")
	if s := listener.ServingGC(listener.Config{}); s.Percent != -1 || s.Limit != 0 {
		t.Fatalf("with GOGC and GOMEMLIMIT set: %+v, want both left alone", s)
	}
}
