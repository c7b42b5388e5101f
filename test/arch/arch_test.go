// Package arch holds the architecture as tests: which packages may depend
// on which.
package arch

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/stratumjoin/stratum"

func deps(t *testing.T, pkg string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", pkg).Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v", pkg, err)
	}
	return strings.Fields(string(out))
}

func TestLayering(t *testing.T) {
	for _, tc := range []struct {
		pkg       string
		forbidden []string
	}{
		// the two sides share only the wire protocol and its helpers
		{module + "/agent", []string{module + "/listener", module + "/internal/cluster", module + "/internal/store"}},
		{module + "/listener", []string{module + "/agent", module + "/hwid"}},
		// the agent binary stays small: no etcd, no bbolt, no admin API
		{module + "/cmd/stratum-agent", []string{"go.etcd.io/etcd", "go.etcd.io/bbolt", module + "/listener", module + "/internal/store"}},
		// the listener never links the hardware probes
		{module + "/cmd/stratum-listener", []string{module + "/hwid", "github.com/jaypipes/ghw", "github.com/NVIDIA/go-nvml", module + "/agent"}},
		// the wire protocol depends on nothing of either side
		{module + "/internal/wire", []string{module + "/agent", module + "/listener", module + "/pki", "github.com/google/go-tpm"}},
		// TPM encodings stay in internal/tpm: wire carries bytes only
		{module + "/hwid", []string{"github.com/google/go-tpm", module + "/internal/tpm"}},
		// decoding frames and collecting facts link neither OPAQUE nor
		// QUIC: the sizes and KSF bounds they check are wire's own
		{module + "/internal/wire", []string{module + "/internal/pake", "github.com/bytemare", "github.com/quic-go/quic-go"}},
		{module + "/hwid", []string{module + "/internal/pake", "github.com/bytemare", "github.com/quic-go/quic-go"}},
		// the agent verifies chains but never makes certificates: it
		// links pki, not the CA, the issuer or the key directory
		{module + "/agent/...", []string{module + "/pki/authority"}},
		{module + "/cmd/stratum-agent", []string{module + "/pki/authority"}},
	} {
		for _, d := range deps(t, tc.pkg) {
			for _, f := range tc.forbidden {
				if d == f || strings.HasPrefix(d, f+"/") {
					t.Errorf("%s depends on %s", tc.pkg, d)
				}
			}
		}
	}
}

func TestEveryPackageDocumented(t *testing.T) {
	// packages with only tests have no doc to show
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}} {{len .GoFiles}} {{.Doc}}", module+"/...").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.SplitN(line, " ", 3)
		if f[1] != "0" && (len(f) < 3 || f[2] == "") {
			path := f[0]
			t.Errorf("%s has no package doc comment", path)
		}
	}
}

// TestListenerBuildsWithoutCgo: the listener (with the TPM verifier) is
// pure Go, so it builds as a static binary.
func TestListenerBuildsWithoutCgo(t *testing.T) {
	cmd := exec.Command("go", "build", "-o", t.TempDir()+"/stratum-listener", module+"/cmd/stratum-listener")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("CGO_ENABLED=0 go build: %v\n%s", err, out)
	}
}
