package main

import (
	"testing"

	"github.com/rogpeppe/go-internal/testscript"

	"github.com/stratumjoin/stratum/internal/clitest"
)

// TestMain lets the test binary run as stratum-listener: the scripts'
// `exec stratum-listener` runs main in this binary.
func TestMain(m *testing.M) {
	testscript.Main(m, map[string]func(){"stratum-listener": main})
}

// TestScripts runs testdata/script/*.txtar: the command line's usage
// errors, exit statuses and admin commands against a real `serve`.
func TestScripts(t *testing.T) {
	testscript.Run(t, testscript.Params{
		Dir:                 "testdata/script",
		Cmds:                clitest.Cmds(),
		RequireExplicitExec: true,
	})
}
