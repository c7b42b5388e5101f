// Package netns joins machines to a listener over a real network: the
// stratum-listener and stratum-agent binaries run in network namespaces of
// their own, linked by a veth pair, so a join code pinned to a MAC meets
// the MAC the agent's kernel really reports.
//
// It needs root and iproute2's `ip` (CI runs as root); without them it
// fails, saying so, except under -short (make test-short), which skips it.
package netns

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"github.com/stratumjoin/stratum/internal/testbin"
	"github.com/stratumjoin/stratum/internal/testenv"
)

// binDir holds the stratum-listener and stratum-agent built for this run.
var binDir string

func TestMain(m *testing.M) {
	flag.Parse()
	if why := testenv.Missing(true, map[string]string{"ip": "iproute2"}); why != "" {
		if testing.Short() {
			fmt.Fprintln(os.Stderr, "test/netns: skipped under -short:", why)
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "test/netns: network namespaces and veth links need root and iproute2:", why, "(CI runs as root)")
		os.Exit(1)
	}
	os.Exit(testbin.Run(m, &binDir, "./cmd/stratum-listener", "./cmd/stratum-agent"))
}
