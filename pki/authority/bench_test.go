package authority_test

import (
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/stratumjoin/stratum/pki"
	"github.com/stratumjoin/stratum/pki/authority"
	"github.com/stratumjoin/stratum/pki/pkitest"
)

// BenchmarkIssueNode is the listener's certificate cost per join: CSR
// parse and signature check, one ECDSA P-256 signature (which
// x509.CreateCertificate checks once itself), and the validator's checks
// of the leaf (the chain was verified when the CA was loaded).
func BenchmarkIssueNode(b *testing.B) {
	ca := pkitest.NewCA(b)
	csr, _ := pkitest.NewCSR(b, pkitest.CSROptions{})
	req := authority.NodeRequest{CSR: csr, NodeID: mustNodeID(b), TrustDomain: pkitest.TrustDomain, Role: pki.RoleNode}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ca.IssueNode(req); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkIssueNodeSteps splits IssueNode into its parts, so the floor
// (one signature) can be read next to what the checks add.
func BenchmarkIssueNodeSteps(b *testing.B) {
	caKey := pkitest.NewKey(b).(*ecdsa.PrivateKey)
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "bench root"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true,
	}
	root := pkitest.CreateCert(b, caTmpl, caTmpl, caKey.Public(), caKey)
	csrDER, nodeKey := pkitest.NewCSR(b, pkitest.CSROptions{})
	leafTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "node"},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, BasicConstraintsValid: true,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
		URIs:        []*url.URL{{Scheme: "spiffe", Host: "bench", Path: "/node/x"}},
	}
	leaf := pkitest.CreateCert(b, leafTmpl, root, nodeKey.Public(), caKey)
	roots := x509.NewCertPool()
	roots.AddCert(root)

	b.Run("ecdsa-p256-sign", func(b *testing.B) {
		digest := sha256.Sum256(leaf.RawTBSCertificate)
		for b.Loop() {
			if _, err := ecdsa.SignASN1(rand.Reader, caKey, digest[:]); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("csr-parse-and-check", func(b *testing.B) {
		for b.Loop() {
			csr, err := x509.ParseCertificateRequest(csrDER)
			if err != nil || csr.CheckSignature() != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("create-certificate", func(b *testing.B) {
		for b.Loop() {
			if _, err := x509.CreateCertificate(rand.Reader, leafTmpl, root, nodeKey.Public(), caKey); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("verify-chain", func(b *testing.B) {
		opts := x509.VerifyOptions{Roots: roots, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
		for b.Loop() {
			if _, err := leaf.Verify(opts); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// IssueNode runs on many joins at once; the race detector watches this.
func TestIssueNodeConcurrently(t *testing.T) {
	ca := pkitest.NewCA(t)
	csr, _ := pkitest.NewCSR(t, pkitest.CSROptions{})
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for range 16 {
		wg.Go(func() {
			_, err := ca.IssueNode(authority.NodeRequest{CSR: csr, NodeID: mustNodeID(t), TrustDomain: pkitest.TrustDomain, Role: pki.RoleNode})
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

func FuzzIssueNodeCSR(f *testing.F) {
	f.Add(readFile(f, "testdata/csr/openssl-hostile.der"))
	csr, _ := pkitest.NewCSR(f, pkitest.CSROptions{RequestCA: true, DNSNames: []string{"a.example"}})
	f.Add(csr)
	ca := pkitest.NewCA(f)
	nodeID := mustNodeID(f)
	f.Fuzz(func(t *testing.T, csr []byte) {
		der, err := ca.IssueNode(authority.NodeRequest{CSR: csr, NodeID: nodeID, TrustDomain: pkitest.TrustDomain, Role: pki.RoleNode})
		if err != nil {
			return
		}
		cert, err := x509.ParseCertificate(der)
		if err != nil {
			t.Fatalf("issued certificate does not parse: %v", err)
		}
		if id, _, err := pki.NodeIdentity(cert, pkitest.TrustDomain); err != nil || id != nodeID || cert.IsCA || len(cert.DNSNames) != 0 {
			t.Fatalf("issued certificate says more than the listener decided: %v", err)
		}
	})
}
