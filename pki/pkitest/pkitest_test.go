package pkitest_test

import (
	"encoding/asn1"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stratumjoin/stratum/pki/pkitest"
)

// The issuing tests prove that a CSR's requests are ignored; that proof is
// only worth something if the CSRs really make those requests. openssl
// reads them back here.
func TestNewCSRAsksForWhatItSays(t *testing.T) {
	der, _ := pkitest.NewCSR(t, pkitest.CSROptions{
		CommonName:   "admin",
		DNSNames:     []string{"kubernetes.default"},
		IPs:          []net.IP{net.ParseIP("10.0.0.1")},
		RequestCA:    true,
		ExtKeyUsages: []asn1.ObjectIdentifier{pkitest.OIDCodeSigning},
	})
	path := filepath.Join(t.TempDir(), "req.der")
	if err := os.WriteFile(path, der, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("/usr/bin/openssl", "req", "-inform", "DER", "-in", path, "-noout", "-text", "-verify").CombinedOutput()
	if err != nil {
		t.Fatalf("openssl req: %v\n%s", err, out)
	}
	for _, want := range []string{
		"Certificate request self-signature verify OK",
		"CN = admin",
		"DNS:kubernetes.default",
		"IP Address:10.0.0.1",
		"X509v3 Basic Constraints: critical",
		"CA:TRUE, pathlen:5",
		"Certificate Sign, CRL Sign",
		"Code Signing",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("openssl does not show %q in\n%s", want, out)
		}
	}
}

func TestExternalCA(t *testing.T) {
	ext := pkitest.NewExternalCA(t)
	if err := ext.Intermediate.CheckSignatureFrom(ext.Root); err != nil {
		t.Fatal(err)
	}
	if !ext.Intermediate.IsCA || !ext.Intermediate.MaxPathLenZero {
		t.Error("intermediate is not an issuing CA with path length 0")
	}
}
