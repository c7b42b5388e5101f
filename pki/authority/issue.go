package authority

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/stratumjoin/stratum/pki"
)

const (
	// DefaultNodeLifetime is a node certificate's lifetime when the request
	// names none; the agent renews at 2/3 of it.
	DefaultNodeLifetime = 7 * 24 * time.Hour
	// ListenerLifetime is a listener certificate's lifetime.
	ListenerLifetime = 365 * 24 * time.Hour

	// maxCSRSize bounds what we parse; a P-256 CSR is about 250 bytes.
	maxCSRSize = 16 << 10
	minRSABits = 2048
	maxRSABits = 8192
)

var (
	// ErrInvalidCSR marks a certificate request the listener refuses: not
	// a CSR, a bad self-signature, or a key type or size we do not accept.
	ErrInvalidCSR = errors.New("invalid certificate request")
	// ErrInvalidRequest marks an issuing request whose listener-chosen
	// fields (node id, trust domain, role, lifetime, names) are wrong: a
	// bug in the caller, not the joiner's doing.
	ErrInvalidRequest = errors.New("invalid issuing request")
)

// NodeRequest is what the listener decided about a node certificate. Only
// the CSR comes from the node, and only its public key is used.
type NodeRequest struct {
	CSR []byte // DER, from the agent's Proof
	// Parsed, when set, is CSR as ParseCSR returned it, and CSR is not
	// read: a caller that checked the request already (the listener needs
	// its key before it issues) does not pay for the parse and the
	// signature check twice.
	Parsed      *CSR
	NodeID      string // chosen by the listener, see NodeID
	TrustDomain string
	Role        string        // pki.RoleNode or pki.RoleNodeTenant
	Lifetime    time.Duration // 0 means DefaultNodeLifetime
	Now         time.Time     // zero means time.Now()
}

// IssueNode signs a node certificate for req and returns its DER. The
// certificate has CN = NodeID, exactly one URI SAN (pki.NodeURI), no other SAN
// whatever the CSR asks for, CA:FALSE, digitalSignature, clientAuth and
// serverAuth, a random 128-bit serial, and a lifetime capped at the CA's
// expiry. It is verified against the root before it is returned.
func (ca *CA) IssueNode(req NodeRequest) ([]byte, error) {
	cert, err := ca.IssueNodeCert(req)
	if err != nil {
		return nil, err
	}
	return cert.Raw, nil
}

// IssueNodeCert is IssueNode returning the parsed certificate, so that a
// caller that reads its serial and lifetime does not parse it again.
func (ca *CA) IssueNodeCert(req NodeRequest) (*x509.Certificate, error) {
	if !pki.ValidTrustDomain(req.TrustDomain) {
		return nil, fmt.Errorf("issue node: %w: trust domain %q", ErrInvalidRequest, req.TrustDomain)
	}
	if !pki.ValidNodeID(req.NodeID) {
		return nil, fmt.Errorf("issue node: %w: node id %q", ErrInvalidRequest, req.NodeID)
	}
	if req.Role != pki.RoleNode && req.Role != pki.RoleNodeTenant {
		return nil, fmt.Errorf("issue node: %w: role %q", ErrInvalidRequest, req.Role)
	}
	lifetime := req.Lifetime
	if lifetime == 0 {
		lifetime = DefaultNodeLifetime
	}
	if lifetime < 0 {
		return nil, fmt.Errorf("issue node: %w: negative lifetime %v", ErrInvalidRequest, lifetime)
	}
	csr := req.Parsed
	if csr == nil {
		var err error
		if csr, err = ParseCSR(req.CSR); err != nil {
			return nil, fmt.Errorf("issue node: %w", err)
		}
	}
	pub := csr.pub
	if err := checkKey(pub); err != nil {
		return nil, fmt.Errorf("issue node: %w: %w", ErrInvalidCSR, err)
	}
	now := req.Now
	if now.IsZero() {
		now = time.Now()
	}
	uri := pki.NodeURI(req.TrustDomain, req.Role, req.NodeID)
	spec := leafSpec{
		commonName: req.NodeID,
		uri:        uri,
		usage:      x509.ExtKeyUsageClientAuth,
	}
	cert, err := ca.issueLeaf(spec, pub, now, lifetime)
	if err != nil {
		return nil, fmt.Errorf("issue node %s: %w", req.NodeID, err)
	}
	return cert, nil
}

// IssueListener signs the listener's QUIC server certificate for pub: URI
// SAN pki.ListenerIdentity(trustDomain) plus the given DNS names and IPs,
// serverAuth and clientAuth, valid for ListenerLifetime capped at the CA's
// expiry.
func (ca *CA) IssueListener(pub crypto.PublicKey, trustDomain string, dnsNames []string, ips []net.IP, now time.Time) ([]byte, error) {
	if !pki.ValidTrustDomain(trustDomain) {
		return nil, fmt.Errorf("issue listener: %w: trust domain %q", ErrInvalidRequest, trustDomain)
	}
	if err := checkKey(pub); err != nil {
		return nil, fmt.Errorf("issue listener: %w: %w", ErrInvalidRequest, err)
	}
	for _, name := range dnsNames {
		if !validDNSName(name) {
			return nil, fmt.Errorf("issue listener: %w: dns name %q", ErrInvalidRequest, name)
		}
	}
	for _, ip := range ips {
		if len(ip) != net.IPv4len && len(ip) != net.IPv6len {
			return nil, fmt.Errorf("issue listener: %w: ip address %v", ErrInvalidRequest, ip)
		}
	}
	if now.IsZero() {
		now = time.Now()
	}
	spec := leafSpec{
		commonName: "Stratum Join listener " + trustDomain,
		uri:        pki.ListenerIdentity(trustDomain),
		dnsNames:   dnsNames,
		ips:        ips,
		usage:      x509.ExtKeyUsageServerAuth,
	}
	cert, err := ca.issueLeaf(spec, pub, now, ListenerLifetime)
	if err != nil {
		return nil, fmt.Errorf("issue listener: %w", err)
	}
	return cert.Raw, nil
}

// leafSpec is everything a leaf certificate says, as the listener decided
// it; the validator holds the issued certificate to exactly this.
type leafSpec struct {
	commonName string
	uri        string
	dnsNames   []string
	ips        []net.IP
	usage      x509.ExtKeyUsage // the usage the chain is verified for
}

var leafExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth}

func (ca *CA) issueLeaf(spec leafSpec, pub crypto.PublicKey, now time.Time, lifetime time.Duration) (*x509.Certificate, error) {
	u, err := url.Parse(spec.uri)
	if err != nil {
		return nil, fmt.Errorf("%w: uri %q: %w", ErrInvalidRequest, spec.uri, err)
	}
	notAfter := now.Add(lifetime)
	if notAfter.After(ca.notAfter) {
		notAfter = ca.notAfter
	}
	if !notAfter.After(now) {
		return nil, fmt.Errorf("ca expired at %s", ca.notAfter.UTC().Format(time.RFC3339))
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: spec.commonName},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           leafExtKeyUsage,
		BasicConstraintsValid: true,
		IsCA:                  false,
		URIs:                  []*url.URL{u},
		DNSNames:              spec.dnsNames,
		IPAddresses:           spec.ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert(), pub, ca.signer)
	if err != nil {
		return nil, fmt.Errorf("sign: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse issued certificate: %w", err)
	}
	if err := ca.validateLeaf(cert, spec, pub, now); err != nil {
		return nil, fmt.Errorf("issued certificate failed validation: %w", err)
	}
	return cert, nil
}

// validateLeaf is the last check before a certificate leaves the CA: it
// must chain to the root for its purpose and say exactly what spec says.
//
// For a direct chain (directChain) valid now, the chain is not built
// again per leaf: newCA verified chain[0] to the root for both usages a
// leaf has, and x509.CreateCertificate checked the leaf's signature with
// chain[0]'s key (it refuses a signer that is not the parent's key, and
// verifies what the signer returned), so x509.Verify would only repeat an
// ECDSA verification and the chain building on every join. What is left
// to the leaf is checked here: its issuer name and its validity now.
func (ca *CA) validateLeaf(cert *x509.Certificate, spec leafSpec, pub crypto.PublicKey, now time.Time) error {
	if ca.direct && !now.Before(ca.notBefore) && !now.After(ca.notAfter) {
		switch {
		case !bytes.Equal(cert.RawIssuer, ca.Cert().RawSubject):
			return errors.New("issuer is not the ca certificate")
		case now.Before(cert.NotBefore) || now.After(cert.NotAfter):
			return errors.New("not valid now")
		}
	} else if _, err := cert.Verify(x509.VerifyOptions{
		Roots:         ca.roots,
		Intermediates: ca.intermediates,
		CurrentTime:   now,
		KeyUsages:     []x509.ExtKeyUsage{spec.usage},
	}); err != nil {
		return err
	}
	switch {
	case !cert.BasicConstraintsValid || cert.IsCA:
		return errors.New("not marked CA:FALSE")
	case cert.KeyUsage != x509.KeyUsageDigitalSignature:
		return errors.New("unexpected key usage")
	case !slices.Equal(cert.ExtKeyUsage, leafExtKeyUsage) || len(cert.UnknownExtKeyUsage) != 0:
		return errors.New("unexpected extended key usage")
	case len(cert.Subject.Names) != 1 || cert.Subject.CommonName != spec.commonName:
		return fmt.Errorf("unexpected subject %q", cert.Subject.String())
	case len(cert.URIs) != 1 || cert.URIs[0].String() != spec.uri:
		return fmt.Errorf("unexpected uri sans %v", cert.URIs)
	case !slices.Equal(cert.DNSNames, spec.dnsNames):
		return fmt.Errorf("unexpected dns sans %v", cert.DNSNames)
	case !slices.EqualFunc(cert.IPAddresses, spec.ips, net.IP.Equal):
		return fmt.Errorf("unexpected ip sans %v", cert.IPAddresses)
	case len(cert.EmailAddresses) != 0:
		return errors.New("unexpected email sans")
	case !publicKeysEqual(pub, cert.PublicKey):
		return errors.New("public key differs from the requested one")
	}
	return nil
}

// ErrCSRSignature marks a certificate request whose self-signature does
// not verify (it wraps ErrInvalidCSR too): the sender does not hold the
// key it asks a certificate for, unlike a sender whose request is merely
// malformed or names a key the CA does not accept.
var ErrCSRSignature = errors.New("signature does not verify")

// CSR is a certificate request that parsed and whose self-signature
// verified; only ParseCSR makes one. Whether its key is one the CA
// accepts is checked when a certificate is issued for it.
type CSR struct {
	pub  crypto.PublicKey
	spki []byte
}

// PublicKey is the key the request asks a certificate for.
func (c *CSR) PublicKey() crypto.PublicKey { return c.pub }

// RawSubjectPublicKeyInfo is the key's DER SubjectPublicKeyInfo.
func (c *CSR) RawSubjectPublicKeyInfo() []byte { return c.spki }

// ParseCSR parses a DER certificate request and verifies its
// self-signature. Nothing else in the CSR is looked at. Its errors wrap
// ErrInvalidCSR; a signature that does not verify also ErrCSRSignature.
func ParseCSR(der []byte) (*CSR, error) {
	if len(der) == 0 {
		return nil, fmt.Errorf("%w: empty", ErrInvalidCSR)
	}
	if len(der) > maxCSRSize {
		return nil, fmt.Errorf("%w: %d bytes, over the %d-byte limit", ErrInvalidCSR, len(der), maxCSRSize)
	}
	csr, err := x509.ParseCertificateRequest(der)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidCSR, err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("%w: %w: %w", ErrInvalidCSR, ErrCSRSignature, err)
	}
	return &CSR{pub: csr.PublicKey, spki: csr.RawSubjectPublicKeyInfo}, nil
}

// checkKey accepts ECDSA P-256 and P-384, Ed25519, and RSA of 2048 to 8192
// bits.
func checkKey(pub crypto.PublicKey) error {
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		if k.Curve != elliptic.P256() && k.Curve != elliptic.P384() {
			return fmt.Errorf("ecdsa curve %s is not accepted (want P-256 or P-384)", k.Curve.Params().Name)
		}
	case ed25519.PublicKey:
		if len(k) != ed25519.PublicKeySize {
			return errors.New("malformed ed25519 key")
		}
	case *rsa.PublicKey:
		bits := k.N.BitLen()
		if bits < minRSABits {
			return fmt.Errorf("rsa key of %d bits is below the %d-bit minimum", bits, minRSABits)
		}
		if bits > maxRSABits {
			return fmt.Errorf("rsa key of %d bits is over the %d-bit maximum", bits, maxRSABits)
		}
	default:
		return fmt.Errorf("key type %T is not accepted", pub)
	}
	return nil
}

// validDNSName accepts host names of letters, digits, '-' and '.', without
// wildcards: the listener is one host, never a pattern.
func validDNSName(s string) bool {
	if len(s) == 0 || len(s) > 253 || s[0] == '.' || s[len(s)-1] == '.' {
		return false
	}
	for _, label := range strings.Split(s, ".") {
		if len(label) == 0 || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
				return false
			}
		}
	}
	return true
}
