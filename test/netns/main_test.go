// Package netns joins machines to a listener over a real network: the
// stratum-listener and stratum-agent binaries run in network namespaces of
// their own, linked by a veth pair, so a join code pinned to a MAC meets
// the MAC the agent's kernel really reports.
//
// It needs root and iproute2's `ip` (CI runs as root); without them it
// fails, saying so, rather than skipping.
package netns

import (
	"fmt"
	"os"
	"os/exec"
	"testing"

	"github.com/stratumjoin/stratum/internal/testbin"
)

// binDir holds the stratum-listener and stratum-agent built for this run.
var binDir string

func TestMain(m *testing.M) {
	if err := preconditions(); err != nil {
		fmt.Fprintln(os.Stderr, "test/netns:", err)
		os.Exit(1)
	}
	os.Exit(testbin.Run(m, &binDir, "./cmd/stratum-listener", "./cmd/stratum-agent"))
}

// preconditions says what is missing to make network namespaces.
func preconditions() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("must run as root to create network namespaces and veth links (uid %d); CI runs these tests as root", os.Geteuid())
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return fmt.Errorf("iproute2's `ip` is needed to create network namespaces: %w", err)
	}
	return nil
}
