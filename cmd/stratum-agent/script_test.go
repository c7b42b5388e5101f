package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/rogpeppe/go-internal/testscript"

	"github.com/stratumjoin/stratum/internal/clitest"
	"github.com/stratumjoin/stratum/internal/testbin"
)

// TestMain lets the test binary run as stratum-agent: the scripts' `exec
// stratum-agent` runs main in this binary.
func TestMain(m *testing.M) {
	testscript.Main(m, map[string]func(){"stratum-agent": main})
}

// TestScripts runs testdata/script/*.txtar: usage errors and exit
// statuses, and joins against a real listener (the stratum-listener
// binary, built once for the scripts and put first on $PATH).
func TestScripts(t *testing.T) {
	bin := t.TempDir()
	if err := testbin.Build(bin, nil, "./cmd/stratum-listener"); err != nil {
		t.Fatal(err)
	}
	testscript.Run(t, testscript.Params{
		Dir:                 "testdata/script",
		Cmds:                clitest.Cmds(),
		RequireExplicitExec: true,
		Setup: func(e *testscript.Env) error {
			e.Setenv("PATH", bin+string(filepath.ListSeparator)+os.Getenv("PATH"))
			return nil
		},
	})
}
