// Package contract runs both binaries as real processes and checks the
// exit contract operators and systemd rely on (docs/operations.md): 0
// done, 1 refused for good, 2 usage or a cause no restart fixes, 3
// transient.
package contract

import (
	"os"
	"testing"

	"github.com/stratumjoin/stratum/internal/testbin"
)

var binDir string

func TestMain(m *testing.M) {
	os.Exit(testbin.Run(m, &binDir, "./cmd/stratum-listener", "./cmd/stratum-agent"))
}
