// Package pkitest makes throwaway certificate authorities and certificate
// requests for tests of packages that use pki: a fresh root CA, an
// "external" root with an intermediate to import, and CSRs that ask for
// whatever a hostile joiner might ask for.
package pkitest

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"io/fs"
	"math/big"
	"net"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stratumjoin/stratum/pki"
	"github.com/stratumjoin/stratum/pki/authority"
)

// TrustDomain is the trust domain of the CAs this package makes.
const TrustDomain = "test.example"

// NewCA returns a fresh root CA for TrustDomain, valid from now.
func NewCA(t testing.TB) *authority.CA {
	t.Helper()
	ca, err := authority.NewRootCA(TrustDomain, time.Now())
	if err != nil {
		t.Fatalf("pkitest: new root ca: %v", err)
	}
	return ca
}

// NewKey returns a fresh ECDSA P-256 key, the kind an agent makes.
func NewKey(t testing.TB) crypto.Signer {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("pkitest: generate key: %v", err)
	}
	return key
}

// Well-known object identifiers a CSR may use to ask for more than it
// should get.
var (
	OIDBasicConstraints = asn1.ObjectIdentifier{2, 5, 29, 19}
	OIDKeyUsage         = asn1.ObjectIdentifier{2, 5, 29, 15}
	OIDExtKeyUsage      = asn1.ObjectIdentifier{2, 5, 29, 37}
	OIDCodeSigning      = asn1.ObjectIdentifier{1, 3, 6, 1, 5, 5, 7, 3, 3}
	OIDAnyExtKeyUsage   = asn1.ObjectIdentifier{2, 5, 29, 37, 0}
)

// CSROptions is what a CSR asks for. Every field is a request the issuer
// must ignore.
type CSROptions struct {
	CommonName string
	DNSNames   []string
	IPs        []net.IP
	Emails     []string
	URIs       []*url.URL
	// RequestCA adds basicConstraints CA:TRUE (critical) and keyUsage
	// keyCertSign|cRLSign extension requests.
	RequestCA bool
	// ExtKeyUsages adds an extKeyUsage extension request with these OIDs.
	ExtKeyUsages []asn1.ObjectIdentifier
}

// NewCSR returns a DER CSR for a fresh P-256 key, and the key.
func NewCSR(t testing.TB, opts CSROptions) ([]byte, crypto.Signer) {
	t.Helper()
	key := NewKey(t)
	return NewCSRWithKey(t, key, opts), key
}

// NewCSRWithKey returns a DER CSR signed by key.
func NewCSRWithKey(t testing.TB, key crypto.Signer, opts CSROptions) []byte {
	t.Helper()
	tmpl := &x509.CertificateRequest{
		Subject:        pkix.Name{CommonName: opts.CommonName},
		DNSNames:       opts.DNSNames,
		IPAddresses:    opts.IPs,
		EmailAddresses: opts.Emails,
		URIs:           opts.URIs,
	}
	if opts.RequestCA {
		bc, err := asn1.Marshal(struct {
			IsCA       bool `asn1:"optional"`
			MaxPathLen int  `asn1:"optional,default:-1"`
		}{IsCA: true, MaxPathLen: 5})
		if err != nil {
			t.Fatalf("pkitest: marshal basic constraints: %v", err)
		}
		// keyCertSign (bit 5) and cRLSign (bit 6).
		ku, err := asn1.Marshal(asn1.BitString{Bytes: []byte{0x06}, BitLength: 7})
		if err != nil {
			t.Fatalf("pkitest: marshal key usage: %v", err)
		}
		tmpl.ExtraExtensions = append(tmpl.ExtraExtensions,
			pkix.Extension{Id: OIDBasicConstraints, Critical: true, Value: bc},
			pkix.Extension{Id: OIDKeyUsage, Critical: true, Value: ku},
		)
	}
	if len(opts.ExtKeyUsages) > 0 {
		eku, err := asn1.Marshal(opts.ExtKeyUsages)
		if err != nil {
			t.Fatalf("pkitest: marshal ext key usage: %v", err)
		}
		tmpl.ExtraExtensions = append(tmpl.ExtraExtensions, pkix.Extension{Id: OIDExtKeyUsage, Value: eku})
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		t.Fatalf("pkitest: create csr: %v", err)
	}
	return der
}

// ExternalCA is an organisation's existing PKI: a root and an issuing
// intermediate below it, as ImportCA takes them.
type ExternalCA struct {
	Root            *x509.Certificate
	RootKey         crypto.Signer
	Intermediate    *x509.Certificate
	IntermediateKey crypto.Signer
	ChainPEM        []byte // intermediate, then root
	KeyPEM          []byte // the intermediate's key, PKCS#8
}

// NewExternalCA makes a P-384 root and a P-256 intermediate valid from an
// hour ago for a year. The intermediate has MaxPathLen 0, as issuing CAs
// usually do.
func NewExternalCA(t testing.TB) *ExternalCA {
	t.Helper()
	now := time.Now()
	rootKey, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatalf("pkitest: generate root key: %v", err)
	}
	rootTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "Example Corp Root", Organization: []string{"Example Corp"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.AddDate(2, 0, 0),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	root := CreateCert(t, rootTmpl, rootTmpl, rootKey.Public(), rootKey)
	interKey := NewKey(t)
	interTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(2),
		Subject:               pkix.Name{CommonName: "Example Corp Issuing CA 1", Organization: []string{"Example Corp"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.AddDate(1, 0, 0),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	inter := CreateCert(t, interTmpl, root, interKey.Public(), rootKey)
	keyPEM, err := pki.MarshalPrivateKeyPEM(interKey)
	if err != nil {
		t.Fatalf("pkitest: %v", err)
	}
	return &ExternalCA{
		Root:            root,
		RootKey:         rootKey,
		Intermediate:    inter,
		IntermediateKey: interKey,
		ChainPEM:        pki.EncodeCertsPEM([]*x509.Certificate{inter, root}),
		KeyPEM:          keyPEM,
	}
}

// CreateCert signs tmpl with parentKey under parent and parses the result.
func CreateCert(t testing.TB, tmpl, parent *x509.Certificate, pub crypto.PublicKey, parentKey crypto.Signer) *x509.Certificate {
	t.Helper()
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, parentKey)
	if err != nil {
		t.Fatalf("pkitest: create certificate %q: %v", tmpl.Subject.CommonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatalf("pkitest: parse certificate: %v", err)
	}
	return cert
}

// FileMode returns the permission bits of path.
func FileMode(t testing.TB, path string) fs.FileMode {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}

// AssertOnly fails unless dir holds exactly the named entries, in
// directory order: no temporary file left behind.
func AssertOnly(t testing.TB, dir string, names ...string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		got = append(got, e.Name())
	}
	if strings.Join(got, " ") != strings.Join(names, " ") {
		t.Errorf("%s holds %q, want exactly %q", dir, got, names)
	}
}
