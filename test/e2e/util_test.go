package e2e

import (
	"testing"

	"github.com/stratumjoin/stratum/internal/testenv"
)

// freeUDP returns a loopback UDP address for a listener to bind.
func freeUDP(t *testing.T) string { return testenv.FreeUDP(t) }
