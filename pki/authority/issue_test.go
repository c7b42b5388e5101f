package authority_test

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"errors"
	"maps"
	"net"
	"net/url"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stratumjoin/stratum/pki"
	"github.com/stratumjoin/stratum/pki/authority"
	"github.com/stratumjoin/stratum/pki/pkitest"
)

func TestIssueNodeDecidesEveryField(t *testing.T) {
	ca := pkitest.NewCA(t)
	hostile := pkitest.CSROptions{
		CommonName: "admin",
		DNSNames:   []string{"kubernetes.default", "*.example.com"},
		IPs:        []net.IP{net.ParseIP("10.0.0.1"), net.ParseIP("::1")},
		Emails:     []string{"root@example.com"},
		URIs: []*url.URL{
			{Scheme: "spiffe", Host: pkitest.TrustDomain, Path: "/listener"},
			{Scheme: "spiffe", Host: pkitest.TrustDomain, Path: "/node/node-00000000000000000000000000"},
		},
	}
	opensslCSR, err := os.ReadFile("testdata/csr/openssl-hostile.der")
	if err != nil {
		t.Fatal(err)
	}
	p384, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	_, ed, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	rsa2048, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name string
		role string
		key  crypto.Signer // nil: a fresh P-256 key
		csr  []byte        // set: use as is (its key is read back from it)
		opts pkitest.CSROptions
	}{
		{name: "plain", role: pki.RoleNode},
		{name: "other names and cn", role: pki.RoleNode, opts: hostile},
		{name: "ca true and keyCertSign", role: pki.RoleNode, opts: pkitest.CSROptions{RequestCA: true}},
		{name: "extra ekus", role: pki.RoleNode, opts: pkitest.CSROptions{ExtKeyUsages: []asnOID{pkitest.OIDCodeSigning, pkitest.OIDAnyExtKeyUsage}}},
		{name: "everything at once, tenant role", role: pki.RoleNodeTenant, opts: func() pkitest.CSROptions {
			o := hostile
			o.RequestCA = true
			o.ExtKeyUsages = []asnOID{pkitest.OIDCodeSigning}
			return o
		}()},
		{name: "made by openssl", role: pki.RoleNode, csr: opensslCSR},
		{name: "p-384 key", role: pki.RoleNode, key: p384},
		{name: "ed25519 key", role: pki.RoleNodeTenant, key: ed},
		{name: "rsa-2048 key", role: pki.RoleNode, key: rsa2048},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			csrDER := tt.csr
			if csrDER == nil {
				key := tt.key
				if key == nil {
					key = pkitest.NewKey(t)
				}
				csrDER = pkitest.NewCSRWithKey(t, key, tt.opts)
			}
			csr, err := x509.ParseCertificateRequest(csrDER)
			if err != nil {
				t.Fatal(err)
			}
			nodeID := mustNodeID(t)
			now := time.Now()
			der, err := ca.IssueNode(authority.NodeRequest{
				CSR: csrDER, NodeID: nodeID, TrustDomain: pkitest.TrustDomain, Role: tt.role, Now: now,
			})
			if err != nil {
				t.Fatalf("IssueNode: %v", err)
			}
			cert := mustParse(t, der)
			wantURI := "spiffe://" + pkitest.TrustDomain + "/" + tt.role + "/" + nodeID

			if got := cert.Subject.String(); got != "CN="+nodeID {
				t.Errorf("subject = %q, want only CN=%s", got, nodeID)
			}
			if len(cert.URIs) != 1 || cert.URIs[0].String() != wantURI {
				t.Errorf("uri sans = %v, want [%s]", cert.URIs, wantURI)
			}
			if len(cert.DNSNames)+len(cert.IPAddresses)+len(cert.EmailAddresses) != 0 {
				t.Errorf("unexpected sans: dns %v ip %v email %v", cert.DNSNames, cert.IPAddresses, cert.EmailAddresses)
			}
			if !cert.BasicConstraintsValid || cert.IsCA {
				t.Errorf("basic constraints valid=%v ca=%v, want CA:FALSE", cert.BasicConstraintsValid, cert.IsCA)
			}
			if cert.KeyUsage != x509.KeyUsageDigitalSignature {
				t.Errorf("key usage = %v, want digitalSignature only", cert.KeyUsage)
			}
			if want := []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth}; !slices.Equal(cert.ExtKeyUsage, want) || len(cert.UnknownExtKeyUsage) != 0 {
				t.Errorf("ext key usage = %v %v, want %v", cert.ExtKeyUsage, cert.UnknownExtKeyUsage, want)
			}
			if !cert.PublicKey.(interface{ Equal(crypto.PublicKey) bool }).Equal(csr.PublicKey) {
				t.Error("certificate key differs from the csr key")
			}
			if want := now.Add(-time.Minute).Truncate(time.Second); !cert.NotBefore.Equal(want) {
				t.Errorf("not before = %v, want %v", cert.NotBefore, want)
			}
			if want := now.Add(authority.DefaultNodeLifetime).Truncate(time.Second); !cert.NotAfter.Equal(want) {
				t.Errorf("not after = %v, want %v", cert.NotAfter, want)
			}
			if bits := cert.SerialNumber.BitLen(); bits > 128 || cert.SerialNumber.Sign() <= 0 {
				t.Errorf("serial has %d bits (sign %d), want a positive 128-bit number", bits, cert.SerialNumber.Sign())
			}
			if id, role, err := pki.NodeIdentity(cert, pkitest.TrustDomain); err != nil || id != nodeID || role != tt.role {
				t.Errorf("NodeIdentity = %q, %q, %v; want %q, %q", id, role, err, nodeID, tt.role)
			}

			for _, purpose := range []string{"sslclient", "sslserver"} {
				if out, ok := opensslVerify(t, purpose, ca.Root(), cert); !ok {
					t.Errorf("openssl verify -purpose %s refused the node certificate:\n%s", purpose, out)
				}
			}
			wantExt := map[string]string{
				"X509v3 Basic Constraints: critical": "CA:FALSE",
				"X509v3 Extended Key Usage:":         "TLS Web Client Authentication, TLS Web Server Authentication",
				"X509v3 Subject Alternative Name:":   "URI:" + wantURI,
			}
			if got := opensslExtensions(t, cert); !maps.Equal(got, wantExt) {
				t.Errorf("openssl shows extensions %q, want %q", got, wantExt)
			}
		})
	}
}

func TestIssueNodeSerialsDiffer(t *testing.T) {
	ca := pkitest.NewCA(t)
	csr, _ := pkitest.NewCSR(t, pkitest.CSROptions{})
	seen := map[string]bool{}
	for range 20 {
		der, err := ca.IssueNode(authority.NodeRequest{CSR: csr, NodeID: mustNodeID(t), TrustDomain: pkitest.TrustDomain, Role: pki.RoleNode})
		if err != nil {
			t.Fatal(err)
		}
		s := mustParse(t, der).SerialNumber.String()
		if seen[s] {
			t.Fatalf("serial %s issued twice", s)
		}
		seen[s] = true
	}
}

func TestIssueNodeRefusesCSR(t *testing.T) {
	ca := pkitest.NewCA(t)
	good, _ := pkitest.NewCSR(t, pkitest.CSROptions{})

	badSig := slices.Clone(good)
	badSig[len(badSig)-1] ^= 0x01 // last byte of the ECDSA signature's s

	rsa1024, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	p521, err := ecdsa.GenerateKey(elliptic.P521(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	// A CSR whose signature is valid but made by a different key than the
	// one it carries: take key A's CSR body and key B's signature.
	otherKeyCSR, _ := pkitest.NewCSR(t, pkitest.CSROptions{CommonName: "x"})
	swapped := spliceSignature(t, good, otherKeyCSR)

	tests := []struct {
		name    string
		csr     []byte
		wantMsg string
	}{
		{"empty", nil, "empty"},
		{"garbage", []byte("not a certificate request at all"), "invalid certificate request"},
		{"truncated", good[:len(good)/2], "invalid certificate request"},
		{"pem instead of der", []byte("-----BEGIN CERTIFICATE REQUEST-----\n"), "invalid certificate request"},
		{"bad signature", badSig, "signature does not verify"},
		{"signature from another key", swapped, "signature does not verify"},
		{"rsa-1024", pkitest.NewCSRWithKey(t, rsa1024, pkitest.CSROptions{}), "rsa key of 1024 bits is below the 2048-bit minimum"},
		{"p-521", pkitest.NewCSRWithKey(t, p521, pkitest.CSROptions{}), "ecdsa curve P-521 is not accepted"},
		{"oversized", make([]byte, 17<<10), "over the"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			der, err := ca.IssueNode(authority.NodeRequest{CSR: tt.csr, NodeID: mustNodeID(t), TrustDomain: pkitest.TrustDomain, Role: pki.RoleNode})
			if err == nil {
				t.Fatalf("IssueNode accepted it and issued %d bytes", len(der))
			}
			if !errors.Is(err, authority.ErrInvalidCSR) {
				t.Errorf("error %q does not wrap ErrInvalidCSR", err)
			}
			if !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("error %q does not say %q", err, tt.wantMsg)
			}
		})
	}
}

// spliceSignature returns body's CSR info with sigFrom's signature
// algorithm and signature: well-formed, but not signed by its own key.
func spliceSignature(t *testing.T, body, sigFrom []byte) []byte {
	t.Helper()
	a, err := x509.ParseCertificateRequest(body)
	if err != nil {
		t.Fatal(err)
	}
	b, err := x509.ParseCertificateRequest(sigFrom)
	if err != nil {
		t.Fatal(err)
	}
	// A CSR is SEQUENCE { info, algorithm, signature }; rebuild it with
	// b's algorithm and signature after a's info.
	tail := b.Raw[headerLen(b.Raw)+len(b.RawTBSCertificateRequest):]
	content := append(slices.Clone(a.RawTBSCertificateRequest), tail...)
	return append(derHeader(0x30, len(content)), content...)
}

func headerLen(der []byte) int {
	if der[1] < 0x80 {
		return 2
	}
	return 2 + int(der[1]&0x7f)
}

func derHeader(tag byte, n int) []byte {
	switch {
	case n < 0x80:
		return []byte{tag, byte(n)}
	case n < 0x100:
		return []byte{tag, 0x81, byte(n)}
	default:
		return []byte{tag, 0x82, byte(n >> 8), byte(n)}
	}
}

func TestIssueNodeRefusesBadRequest(t *testing.T) {
	ca := pkitest.NewCA(t)
	csr, _ := pkitest.NewCSR(t, pkitest.CSROptions{})
	valid := authority.NodeRequest{CSR: csr, NodeID: mustNodeID(t), TrustDomain: pkitest.TrustDomain, Role: pki.RoleNode}
	tests := []struct {
		name   string
		modify func(*authority.NodeRequest)
	}{
		{"node id not canonical", func(r *authority.NodeRequest) { r.NodeID = strings.ToUpper(r.NodeID) }},
		{"node id empty", func(r *authority.NodeRequest) { r.NodeID = "" }},
		{"node id with a slash", func(r *authority.NodeRequest) { r.NodeID = "node-0000000000000/../listener" }},
		{"role unknown", func(r *authority.NodeRequest) { r.Role = "listener" }},
		{"role empty", func(r *authority.NodeRequest) { r.Role = "" }},
		{"trust domain with a path", func(r *authority.NodeRequest) { r.TrustDomain = "example.org/listener" }},
		{"trust domain upper case", func(r *authority.NodeRequest) { r.TrustDomain = "Example.org" }},
		{"negative lifetime", func(r *authority.NodeRequest) { r.Lifetime = -time.Hour }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := valid
			tt.modify(&req)
			if _, err := ca.IssueNode(req); !errors.Is(err, authority.ErrInvalidRequest) {
				t.Fatalf("IssueNode error = %v, want ErrInvalidRequest", err)
			}
		})
	}
	if _, err := ca.IssueNode(valid); err != nil {
		t.Fatalf("the unmodified request fails: %v", err)
	}
}

func TestIssueNodeLifetime(t *testing.T) {
	ca := pkitest.NewCA(t)
	csr, _ := pkitest.NewCSR(t, pkitest.CSROptions{})
	now := time.Now()
	tests := []struct {
		name     string
		now      time.Time
		lifetime time.Duration
		want     time.Time // NotAfter; zero: expect an error
	}{
		{"default seven days", now, 0, now.Add(7 * 24 * time.Hour)},
		{"one hour", now, time.Hour, now.Add(time.Hour)},
		{"capped at the ca's expiry", ca.NotAfter().Add(-time.Hour), 0, ca.NotAfter()},
		{"ca expired", ca.NotAfter().Add(time.Hour), 0, time.Time{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			der, err := ca.IssueNode(authority.NodeRequest{CSR: csr, NodeID: mustNodeID(t), TrustDomain: pkitest.TrustDomain, Role: pki.RoleNode, Lifetime: tt.lifetime, Now: tt.now})
			if tt.want.IsZero() {
				if err == nil || !strings.Contains(err.Error(), "ca expired") {
					t.Fatalf("IssueNode error = %v, want ca expired", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got, want := mustParse(t, der).NotAfter, tt.want.Truncate(time.Second); !got.Equal(want) {
				t.Errorf("not after = %v, want %v", got, want)
			}
		})
	}
}

func TestIssueListener(t *testing.T) {
	ca := pkitest.NewCA(t)
	key := pkitest.NewKey(t)
	dns := []string{"join.example.org", "localhost"}
	ips := []net.IP{net.ParseIP("192.0.2.240").To4(), net.ParseIP("2001:db8::1")}
	der, err := ca.IssueListener(key.Public(), pkitest.TrustDomain, dns, ips, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	cert := mustParse(t, der)
	if len(cert.URIs) != 1 || cert.URIs[0].String() != pki.ListenerIdentity(pkitest.TrustDomain) {
		t.Errorf("uri sans = %v", cert.URIs)
	}
	if !slices.Equal(cert.DNSNames, dns) || !slices.EqualFunc(cert.IPAddresses, ips, net.IP.Equal) {
		t.Errorf("sans = %v %v, want %v %v", cert.DNSNames, cert.IPAddresses, dns, ips)
	}
	if d := cert.NotAfter.Sub(cert.NotBefore); d < 364*24*time.Hour || d > 366*24*time.Hour {
		t.Errorf("lifetime %v, want a year", d)
	}
	if out, ok := opensslVerify(t, "sslserver", ca.Root(), cert); !ok {
		t.Errorf("openssl verify refused the listener certificate:\n%s", out)
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: pool(ca.Root()), DNSName: "join.example.org"}); err != nil {
		t.Errorf("does not verify for its host name: %v", err)
	}
	if _, td, err := pki.VerifyListenerChain([][]byte{der}, []*x509.Certificate{ca.Root()}, "", time.Now()); err != nil || td != pkitest.TrustDomain {
		t.Errorf("VerifyListenerChain = %q, %v", td, err)
	}

	for _, bad := range []string{"*.example.org", "", "a..b", "-x.example", "x y"} {
		if _, err := ca.IssueListener(key.Public(), pkitest.TrustDomain, []string{bad}, nil, time.Now()); !errors.Is(err, authority.ErrInvalidRequest) {
			t.Errorf("dns name %q: error %v, want ErrInvalidRequest", bad, err)
		}
	}
}

func pool(certs ...*x509.Certificate) *x509.CertPool {
	p := x509.NewCertPool()
	for _, c := range certs {
		p.AddCert(c)
	}
	return p
}

// An imported issuing CA whose name constraints leave out the trust
// domain issues nothing: its leaves are verified through the whole chain,
// not only by the checks a chain without constraints needs.
func TestIssueNodeHonoursNameConstraints(t *testing.T) {
	ext := pkitest.NewExternalCA(t)
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          ext.Intermediate.SerialNumber,
		Subject:               ext.Intermediate.Subject,
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.AddDate(1, 0, 0),
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
		PermittedURIDomains:   []string{"other.example"},
	}
	inter := pkitest.CreateCert(t, tmpl, ext.Root, ext.IntermediateKey.Public(), ext.RootKey)
	ca, err := authority.ImportCA(pki.EncodeCertsPEM([]*x509.Certificate{inter, ext.Root}), ext.KeyPEM)
	if err != nil {
		t.Fatalf("ImportCA: %v", err)
	}
	csr, _ := pkitest.NewCSR(t, pkitest.CSROptions{})
	der, err := ca.IssueNode(authority.NodeRequest{CSR: csr, NodeID: mustNodeID(t), TrustDomain: pkitest.TrustDomain, Role: pki.RoleNode})
	if err == nil {
		t.Fatalf("issued %d bytes outside the issuing CA's name constraints", len(der))
	}
	if !strings.Contains(err.Error(), "failed validation") {
		t.Fatalf("error %q is not the validator's", err)
	}
}

// A request checked once with ParseCSR issues the same certificate as its
// DER; one whose signature does not verify is told apart from a malformed
// one.
func TestParseCSR(t *testing.T) {
	ca := pkitest.NewCA(t)
	good, key := pkitest.NewCSR(t, pkitest.CSROptions{})
	parsed, err := authority.ParseCSR(good)
	if err != nil {
		t.Fatalf("ParseCSR: %v", err)
	}
	der, err := ca.IssueNode(authority.NodeRequest{Parsed: parsed, NodeID: mustNodeID(t), TrustDomain: pkitest.TrustDomain, Role: pki.RoleNode})
	if err != nil {
		t.Fatalf("IssueNode: %v", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	if !cert.PublicKey.(interface{ Equal(crypto.PublicKey) bool }).Equal(key.Public()) {
		t.Fatal("the certificate is not for the request's key")
	}
	badSig := slices.Clone(good)
	badSig[len(badSig)-1] ^= 0x01
	if _, err := authority.ParseCSR(badSig); !errors.Is(err, authority.ErrCSRSignature) || !errors.Is(err, authority.ErrInvalidCSR) {
		t.Fatalf("bad signature: %v, want ErrCSRSignature and ErrInvalidCSR", err)
	}
	if _, err := authority.ParseCSR(good[:len(good)/2]); !errors.Is(err, authority.ErrInvalidCSR) || errors.Is(err, authority.ErrCSRSignature) {
		t.Fatalf("truncated: %v, want ErrInvalidCSR alone", err)
	}
	p521, err := ecdsa.GenerateKey(elliptic.P521(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	weak, err := authority.ParseCSR(pkitest.NewCSRWithKey(t, p521, pkitest.CSROptions{}))
	if err != nil {
		t.Fatalf("ParseCSR checks the signature only: %v", err)
	}
	if _, err := ca.IssueNode(authority.NodeRequest{Parsed: weak, NodeID: mustNodeID(t), TrustDomain: pkitest.TrustDomain, Role: pki.RoleNode}); !errors.Is(err, authority.ErrInvalidCSR) {
		t.Fatalf("P-521 key: %v, want ErrInvalidCSR", err)
	}
}
