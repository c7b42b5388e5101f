package authority

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"time"

	"github.com/stratumjoin/stratum/pki"
)

const (
	// rootYears is how long a root made by NewRootCA or Rotate is valid.
	rootYears = 10
	// clockSkew backdates NotBefore so a peer whose clock is a little
	// behind still accepts a certificate issued a moment ago.
	clockSkew = time.Minute
)

// ErrNotRoot is returned by Rotate for a CA that is an intermediate of an
// external root: rotating it means importing a new intermediate under the
// same root, which keeps the fingerprint (and every code) valid.
var ErrNotRoot = errors.New("ca is an intermediate of an external root: import a new intermediate instead of rotating")

// CA is a certificate authority that can sign: its certificate, its key and
// the chain from its certificate up to a self-signed root. It is immutable
// and safe for concurrent use.
type CA struct {
	chain  []*x509.Certificate // chain[0] is the CA's own cert, chain[len-1] the root
	signer crypto.Signer

	// Prebuilt for the validator every issued certificate goes through.
	roots         *x509.CertPool
	intermediates *x509.CertPool
	// notAfter is the earliest expiry along the chain: nothing issued may
	// outlive it, or it would stop verifying first.
	notAfter time.Time
	// notBefore is the latest start of validity along the chain, and
	// direct says that the chain constrains no leaf beyond what newCA
	// verified (see validateLeaf).
	notBefore time.Time
	direct    bool
}

// NewRootCA makes a self-signed ECDSA P-256 root for trustDomain, valid for
// ten years from now. MaxPathLen is 1 so that, after a rotation, the cross
// certificate of the next root may sit between this root and a leaf.
func NewRootCA(trustDomain string, now time.Time) (*CA, error) {
	if !pki.ValidTrustDomain(trustDomain) {
		return nil, fmt.Errorf("new root ca: invalid trust domain %q", trustDomain)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("new root ca: generate key: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, fmt.Errorf("new root ca: %w", err)
	}
	now = now.UTC()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject: pkix.Name{
			CommonName:   fmt.Sprintf("Stratum Join Root CA %s %s", trustDomain, now.Format(time.DateOnly)),
			Organization: []string{"Stratum Join"},
			// Two roots made on the same day share their CN; a random
			// serialNumber attribute keeps their names distinct, so no
			// verifier can mistake one root for the issuer of the other's
			// certificates.
			SerialNumber: serial.Text(16),
		},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              now.AddDate(rootYears, 0, 0),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLen:            1,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("new root ca: sign: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("new root ca: parse: %w", err)
	}
	return newCA([]*x509.Certificate{cert}, key, now)
}

// ImportCA takes an existing CA: certPEM holds its certificate first and
// every certificate above it, ending with the self-signed root; keyPEM holds
// its private key. The CA certificate must be a CA allowed to sign
// certificates, the key must match it, and the chain must verify to the
// root now, for both client and server authentication.
func ImportCA(certPEM, keyPEM []byte) (*CA, error) {
	chain, err := pki.ParseCertsPEM(certPEM)
	if err != nil {
		return nil, fmt.Errorf("import ca: %w", err)
	}
	key, err := pki.ParsePrivateKeyPEM(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("import ca: %w", err)
	}
	ca, err := newCA(chain, key, time.Now())
	if err != nil {
		return nil, fmt.Errorf("import ca: %w", err)
	}
	return ca, nil
}

// newCA checks that chain and signer make a usable CA at time at, and builds
// the pools the issuing validator needs.
func newCA(chain []*x509.Certificate, signer crypto.Signer, at time.Time) (*CA, error) {
	if len(chain) == 0 {
		return nil, errors.New("empty certificate chain")
	}
	for i, c := range chain {
		if !c.BasicConstraintsValid || !c.IsCA {
			return nil, fmt.Errorf("certificate %d (%s) is not a CA", i+1, c.Subject.CommonName)
		}
		if c.KeyUsage != 0 && c.KeyUsage&x509.KeyUsageCertSign == 0 {
			return nil, fmt.Errorf("certificate %d (%s) may not sign certificates", i+1, c.Subject.CommonName)
		}
	}
	leaf := chain[0]
	if leaf.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, fmt.Errorf("ca certificate %s lacks the certSign key usage", leaf.Subject.CommonName)
	}
	for i := 0; i+1 < len(chain); i++ {
		if !bytes.Equal(chain[i].RawIssuer, chain[i+1].RawSubject) {
			return nil, fmt.Errorf("certificate %d is not issued by certificate %d: chain must run from the ca up to the root", i+1, i+2)
		}
		if err := chain[i].CheckSignatureFrom(chain[i+1]); err != nil {
			return nil, fmt.Errorf("certificate %d is not signed by certificate %d: %w", i+1, i+2, err)
		}
	}
	root := chain[len(chain)-1]
	if !bytes.Equal(root.RawIssuer, root.RawSubject) {
		return nil, errors.New("chain does not end with a self-signed root")
	}
	if err := root.CheckSignatureFrom(root); err != nil {
		return nil, fmt.Errorf("root is not self-signed: %w", err)
	}

	if err := checkKey(signer.Public()); err != nil {
		return nil, fmt.Errorf("ca key: %w", err)
	}
	if !publicKeysEqual(signer.Public(), leaf.PublicKey) {
		return nil, errors.New("ca key does not match the ca certificate")
	}

	ca := &CA{
		chain:         append([]*x509.Certificate(nil), chain...),
		signer:        signer,
		roots:         x509.NewCertPool(),
		intermediates: x509.NewCertPool(),
		notAfter:      leaf.NotAfter,
	}
	ca.roots.AddCert(root)
	for _, c := range chain[:len(chain)-1] {
		ca.intermediates.AddCert(c)
	}
	for _, c := range chain {
		if c.NotAfter.Before(ca.notAfter) {
			ca.notAfter = c.NotAfter
		}
		if c.NotBefore.After(ca.notBefore) {
			ca.notBefore = c.NotBefore
		}
	}
	ca.direct = directChain(chain)
	// The chain must verify for what we issue: an intermediate restricted
	// to, say, email protection would make every node certificate fail.
	for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth} {
		_, err := leaf.Verify(x509.VerifyOptions{
			Roots:         ca.roots,
			Intermediates: ca.intermediates,
			CurrentTime:   at,
			KeyUsages:     []x509.ExtKeyUsage{usage},
		})
		if err != nil {
			return nil, fmt.Errorf("ca chain does not verify to its root: %w", err)
		}
	}
	return ca, nil
}

// directChain reports whether a leaf signed by chain[0] verifies to the
// root whenever chain[0] does and the leaf's own fields are right: no
// certificate of the chain carries name constraints, which would also
// bind the leaf's names, and none limits the path length below what a
// leaf under chain[0] makes (certificate i has i CA certificates between
// it and the leaf).
func directChain(chain []*x509.Certificate) bool {
	for i, c := range chain {
		if c.PermittedDNSDomainsCritical || len(c.PermittedDNSDomains) > 0 || len(c.ExcludedDNSDomains) > 0 ||
			len(c.PermittedIPRanges) > 0 || len(c.ExcludedIPRanges) > 0 ||
			len(c.PermittedEmailAddresses) > 0 || len(c.ExcludedEmailAddresses) > 0 ||
			len(c.PermittedURIDomains) > 0 || len(c.ExcludedURIDomains) > 0 ||
			len(c.UnhandledCriticalExtensions) > 0 {
			return false
		}
		if c.MaxPathLen >= 0 && (c.MaxPathLen > 0 || c.MaxPathLenZero) && i > c.MaxPathLen {
			return false
		}
	}
	return true
}

// Cert is the CA's own certificate, the issuer of what it signs.
func (ca *CA) Cert() *x509.Certificate { return ca.chain[0] }

// Root is the self-signed root at the end of the chain.
func (ca *CA) Root() *x509.Certificate { return ca.chain[len(ca.chain)-1] }

// Chain is the CA's certificate and those above it, up to and including the
// root: the caChain an agent receives.
func (ca *CA) Chain() []*x509.Certificate {
	return append([]*x509.Certificate(nil), ca.chain...)
}

// Intermediates is the chain without its root: what a TLS peer presents
// after its leaf so that a verifier holding only the root can build a path.
func (ca *CA) Intermediates() []*x509.Certificate {
	return append([]*x509.Certificate(nil), ca.chain[:len(ca.chain)-1]...)
}

// NotAfter is the earliest expiry along the chain; nothing this CA issues
// outlives it.
func (ca *CA) NotAfter() time.Time { return ca.notAfter }

// Fingerprint is the SHA-256 of the root's DER: the identity the join
// protocol binds codes to.
func (ca *CA) Fingerprint() [32]byte { return pki.FingerprintOf(ca.Root()) }

// IsRoot reports whether the CA signs with the root's own key, as opposed to
// being an intermediate of an external root.
func (ca *CA) IsRoot() bool { return len(ca.chain) == 1 }

// Rotate makes the next root for trustDomain and a cross certificate: the
// new root's subject and key, issued by this CA. A TLS server presenting a
// leaf of the new root followed by the cross certificate verifies under the
// new root alone and under this CA's root alone, so an agent that learned
// only the old root through the PAKE can still authenticate the listener
// and be told its code is stale. The cross certificate expires with this
// CA's chain and may sign nothing but leaves (MaxPathLen 0).
//
// Only the previous root is bridged: the roots' MaxPathLen of 1 leaves room
// for one cross certificate, so after two rotations an agent that knows
// only the root before last cannot authenticate the listener. Its code is
// two rotations stale, and codes live hours, so this is accepted.
func (ca *CA) Rotate(trustDomain string, now time.Time) (next *CA, cross *x509.Certificate, err error) {
	if !ca.IsRoot() {
		return nil, nil, ErrNotRoot
	}
	next, err = NewRootCA(trustDomain, now)
	if err != nil {
		return nil, nil, fmt.Errorf("rotate: %w", err)
	}
	newRoot := next.Root()
	serial, err := randomSerial()
	if err != nil {
		return nil, nil, fmt.Errorf("rotate: %w", err)
	}
	notAfter := newRoot.NotAfter
	if ca.notAfter.Before(notAfter) {
		notAfter = ca.notAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		// Byte-identical subject and key identifier: to a verifier the cross
		// certificate is another issuer certificate for the same CA.
		RawSubject:            newRoot.RawSubject,
		SubjectKeyId:          newRoot.SubjectKeyId,
		NotBefore:             now.UTC().Add(-clockSkew),
		NotAfter:              notAfter,
		KeyUsage:              newRoot.KeyUsage,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLen:            0,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert(), newRoot.PublicKey, ca.signer)
	if err != nil {
		return nil, nil, fmt.Errorf("rotate: sign cross certificate: %w", err)
	}
	cross, err = x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, fmt.Errorf("rotate: parse cross certificate: %w", err)
	}
	if _, err := cross.Verify(x509.VerifyOptions{
		Roots:       ca.roots,
		CurrentTime: now,
		KeyUsages:   []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
	}); err != nil {
		return nil, nil, fmt.Errorf("rotate: cross certificate does not verify under the old root: %w", err)
	}
	return next, cross, nil
}

// randomSerial draws a positive 128-bit serial from crypto/rand.
func randomSerial() (*big.Int, error) {
	limit := new(big.Int).Lsh(big.NewInt(1), 128)
	for {
		n, err := rand.Int(rand.Reader, limit)
		if err != nil {
			return nil, fmt.Errorf("draw serial number: %w", err)
		}
		if n.Sign() > 0 {
			return n, nil
		}
	}
}

func publicKeysEqual(a, b crypto.PublicKey) bool {
	ka, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && ka.Equal(b)
}
