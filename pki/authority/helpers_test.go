package authority_test

import (
	"crypto/x509"
	"encoding/asn1"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stratumjoin/stratum/pki"
)

const opensslBin = "/usr/bin/openssl"

// writePEM writes certs to a fresh file in t's temp dir and returns its path.
func writePEM(t *testing.T, name string, certs ...*x509.Certificate) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, pki.EncodeCertsPEM(certs), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// opensslVerify runs the real openssl verify of leaf under root, with
// untrusted intermediates, for purpose (sslclient or sslserver), and
// returns its combined output and whether it accepted.
func opensslVerify(t *testing.T, purpose string, root *x509.Certificate, leaf *x509.Certificate, untrusted ...*x509.Certificate) (string, bool) {
	t.Helper()
	args := []string{"verify", "-x509_strict", "-purpose", purpose, "-CAfile", writePEM(t, "root.pem", root)}
	if len(untrusted) > 0 {
		args = append(args, "-untrusted", writePEM(t, "untrusted.pem", untrusted...))
	}
	args = append(args, writePEM(t, "leaf.pem", leaf))
	out, err := exec.Command(opensslBin, args...).CombinedOutput()
	return string(out), err == nil && strings.HasSuffix(strings.TrimSpace(string(out)), ": OK")
}

// opensslExtensions returns what openssl prints for the SAN, basic
// constraints and EKU extensions of cert: each extension's header line
// (with ", critical" if so) mapped to its value lines.
func opensslExtensions(t *testing.T, cert *x509.Certificate) map[string]string {
	t.Helper()
	out, err := exec.Command(opensslBin, "x509", "-noout",
		"-ext", "subjectAltName,basicConstraints,extendedKeyUsage",
		"-in", writePEM(t, "cert.pem", cert)).CombinedOutput()
	if err != nil {
		t.Fatalf("openssl x509 -ext: %v\n%s", err, out)
	}
	exts := map[string]string{}
	header := ""
	for _, l := range strings.Split(string(out), "\n") {
		switch {
		case strings.TrimSpace(l) == "":
		case !strings.HasPrefix(l, " "):
			header = strings.TrimSpace(l)
			exts[header] = ""
		default:
			exts[header] = strings.TrimSpace(exts[header] + "\n" + strings.TrimSpace(l))
		}
	}
	return exts
}

func mustParse(t *testing.T, der []byte) *x509.Certificate {
	t.Helper()
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatalf("parse certificate: %v", err)
	}
	return c
}

func mustNodeID(t testing.TB) string {
	t.Helper()
	id, err := pki.NodeID()
	if err != nil {
		t.Fatal(err)
	}
	return id
}

type asnOID = asn1.ObjectIdentifier

func readFile(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func privateDir(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "private")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	return dir
}
