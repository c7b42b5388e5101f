// Package testbin builds this module's commands for the tests that run the
// real binaries (test/e2e, test/netns, test/service, bench).
package testbin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Build runs `go build flags... pkgs...` in the module root, writing the
// binaries into dir.
func Build(dir string, flags []string, pkgs ...string) error {
	gomod, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return fmt.Errorf("go env GOMOD: %w", err)
	}
	args := append(append([]string{"build", "-o", dir + "/"}, flags...), pkgs...)
	cmd := exec.Command("go", args...)
	cmd.Dir = filepath.Dir(strings.TrimSpace(string(gomod)))
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// Run is a TestMain body: it builds pkgs into a fresh temporary directory,
// stores its path in *dir, runs the tests and removes the directory. It
// returns the exit code for os.Exit.
func Run(m *testing.M, dir *string, pkgs ...string) int {
	d, err := os.MkdirTemp("", "stratum-test-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(d)
	if err := Build(d, nil, pkgs...); err != nil {
		fmt.Fprintln(os.Stderr, "build binaries:", err)
		return 1
	}
	*dir = d
	return m.Run()
}
