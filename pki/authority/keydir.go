package authority

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/stratumjoin/stratum/pki"
)

// Files in a KeyDir. All are 0600 in a 0700 directory, public ones too:
// the directory is the listener's alone.
const (
	CAKeyFile        = "ca.key"            // the current CA's private key, PKCS#8
	CACertFile       = "ca.crt"            // the current CA's certificate, then those above it up to the root
	ListenerKeyFile  = "listener.key"      // the QUIC server key, PKCS#8
	ListenerCertFile = "listener.crt"      // the QUIC server chain: leaf, cross certificate, intermediates
	RootsFile        = "roots.pem"         // every root this cluster has used, newest first
	RetiredRootsFile = "retired-roots.pem" // roots `ca retire` ended; they no longer chain anything

	// A rotation stages the next CA under these names, then renames them
	// over ca.key and ca.crt; LoadCA finishes a rotation a crash cut short.
	nextCAKeyFile  = "next-ca.key"
	nextCACertFile = "next-ca.crt"
)

// CrossCertFile names the file holding the cross certificate of root: the
// root's subject and key signed by the root before it.
func CrossCertFile(root *x509.Certificate) string {
	fp := pki.FingerprintOf(root)
	return "cross-" + hex.EncodeToString(fp[:8]) + ".crt"
}

var (
	// ErrInitialized is returned by Init for a directory that already
	// holds a CA.
	ErrInitialized = errors.New("key directory already holds a ca")
	// ErrListenerCertStale is returned by LoadListenerCert for a listener
	// certificate that is not the current CA's (as after a rotation).
	ErrListenerCertStale = errors.New("listener certificate was not issued by the current ca")
)

// KeyDir is the listener's key directory. Nothing in it goes into the
// store in clear: listeners of one cluster share the CA and OPAQUE keys
// through the store only sealed under a key-encryption key that the store
// never holds (docs/cluster.md), so a stolen store or etcd backup holds no
// key.
type KeyDir struct{ Path string }

// ListenerConfig is what the listener's certificate names besides its
// SPIFFE identity: the host names and addresses of its endpoints.
type ListenerConfig struct {
	TrustDomain string
	DNSNames    []string
	IPs         []net.IP
}

func (d KeyDir) file(name string) string { return filepath.Join(d.Path, name) }

// Init writes ca into an empty key directory (ca.key, ca.crt, roots.pem)
// and issues the listener's certificate under it. It refuses, with
// ErrInitialized, to touch a directory that already holds a CA: ca.key is
// created with link(2), so even two racing inits cannot both succeed. If a
// later step fails, Init removes what it wrote, so it can be run again.
func (d KeyDir) Init(ca *CA, listener ListenerConfig, now time.Time) (tls.Certificate, error) {
	for _, name := range []string{CAKeyFile, CACertFile} {
		if _, err := os.Lstat(d.file(name)); err == nil {
			return tls.Certificate{}, fmt.Errorf("init %s: %w (%s exists)", d.Path, ErrInitialized, name)
		}
	}
	keyPEM, err := pki.MarshalPrivateKeyPEM(ca.signer)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("init %s: %w", d.Path, err)
	}
	if err := pki.CreateSecretFile(d.file(CAKeyFile), keyPEM); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return tls.Certificate{}, fmt.Errorf("init %s: %w", d.Path, ErrInitialized)
		}
		return tls.Certificate{}, fmt.Errorf("init: %w", err)
	}
	cert, err := d.initRest(ca, listener, now)
	if err != nil {
		for _, name := range []string{ListenerCertFile, ListenerKeyFile, RootsFile, CACertFile, CAKeyFile} {
			os.Remove(d.file(name))
		}
		return tls.Certificate{}, fmt.Errorf("init: %w", err)
	}
	return cert, nil
}

func (d KeyDir) initRest(ca *CA, listener ListenerConfig, now time.Time) (tls.Certificate, error) {
	if err := pki.WriteSecretFile(d.file(CACertFile), pki.EncodeCertsPEM(ca.chain)); err != nil {
		return tls.Certificate{}, err
	}
	if err := pki.WriteSecretFile(d.file(RootsFile), pki.EncodeCertsPEM([]*x509.Certificate{ca.Root()})); err != nil {
		return tls.Certificate{}, err
	}
	return d.IssueListenerCert(ca, listener, now)
}

// LoadCA reads the current CA. It first finishes a rotation that a crash
// interrupted (see Rotate), and makes sure roots.pem lists the current
// root. The chain is checked as ImportCA checks it, but at the moment all
// its certificates were valid rather than now, so that an expired CA still
// loads and can be rotated; issuing under it fails.
func (d KeyDir) LoadCA() (*CA, error) {
	if err := d.finishRotation(); err != nil {
		return nil, fmt.Errorf("load ca from %s: finish interrupted rotation: %w", d.Path, err)
	}
	chain, key, err := d.readCA(CACertFile, CAKeyFile)
	if err != nil {
		return nil, fmt.Errorf("load ca from %s: %w", d.Path, err)
	}
	ca, err := newCA(chain, key, latestNotBefore(chain))
	if err != nil {
		return nil, fmt.Errorf("load ca from %s: %w", d.Path, err)
	}
	if err := d.ensureRoot(ca.Root()); err != nil {
		return nil, fmt.Errorf("load ca from %s: %w", d.Path, err)
	}
	return ca, nil
}

func (d KeyDir) readCA(certName, keyName string) ([]*x509.Certificate, crypto.Signer, error) {
	keyPEM, err := d.readSecret(keyName)
	if err != nil {
		return nil, nil, err
	}
	certPEM, err := os.ReadFile(d.file(certName))
	if err != nil {
		return nil, nil, err
	}
	key, err := pki.ParsePrivateKeyPEM(keyPEM)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", keyName, err)
	}
	chain, err := pki.ParseCertsPEM(certPEM)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", certName, err)
	}
	return chain, key, nil
}

// readSecret reads a key file, refusing one that group or others can read:
// a key that was exposed should be replaced, not used.
func (d KeyDir) readSecret(name string) ([]byte, error) {
	path := d.file(name)
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("%s has mode %#o; a key file must be 0600", path, perm)
	}
	return os.ReadFile(path)
}

// latestNotBefore is the moment the last certificate of chain became
// valid: if the chain was ever valid as a whole, it was then.
func latestNotBefore(chain []*x509.Certificate) time.Time {
	var t time.Time
	for _, c := range chain {
		if c.NotBefore.After(t) {
			t = c.NotBefore
		}
	}
	return t
}

// Roots reads roots.pem: every root the cluster has used, newest first.
// It is the CA bundle nodes receive.
func (d KeyDir) Roots() ([]*x509.Certificate, error) {
	data, err := os.ReadFile(d.file(RootsFile))
	if err != nil {
		return nil, fmt.Errorf("read roots: %w", err)
	}
	roots, err := pki.ParseCertsPEM(data)
	if err != nil {
		return nil, fmt.Errorf("read roots from %s: %w", d.Path, err)
	}
	return roots, nil
}

// RetiredRoots reads the roots `ca retire` ended; none when the file is
// absent.
func (d KeyDir) RetiredRoots() ([]*x509.Certificate, error) {
	data, err := os.ReadFile(d.file(RetiredRootsFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read retired roots: %w", err)
	}
	return pki.ParseCertsPEM(data)
}

// Retire ends every root but the current CA's: roots.pem keeps only the
// current root, and the others move to retired-roots.pem. It returns the
// roots it retired (none when only the current root was left).
func (d KeyDir) Retire() ([]*x509.Certificate, error) {
	ca, err := d.LoadCA()
	if err != nil {
		return nil, fmt.Errorf("retire: %w", err)
	}
	roots, err := d.Roots()
	if err != nil {
		return nil, fmt.Errorf("retire: %w", err)
	}
	var retired []*x509.Certificate
	for _, r := range roots {
		if !bytes.Equal(r.Raw, ca.Root().Raw) {
			retired = append(retired, r)
		}
	}
	if len(retired) == 0 {
		return nil, nil
	}
	before, err := d.RetiredRoots()
	if err != nil {
		return nil, err
	}
	if err := pki.WriteSecretFile(d.file(RetiredRootsFile), pki.EncodeCertsPEM(append(retired, before...))); err != nil {
		return nil, fmt.Errorf("retire: %w", err)
	}
	if err := pki.WriteSecretFile(d.file(RootsFile), pki.EncodeCertsPEM([]*x509.Certificate{ca.Root()})); err != nil {
		return nil, fmt.Errorf("retire: %w", err)
	}
	return retired, nil
}

// ensureRoot puts root first in roots.pem unless it is already listed.
func (d KeyDir) ensureRoot(root *x509.Certificate) error {
	roots, err := d.Roots()
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	for _, r := range roots {
		if bytes.Equal(r.Raw, root.Raw) {
			return nil
		}
	}
	return pki.WriteSecretFile(d.file(RootsFile), pki.EncodeCertsPEM(append([]*x509.Certificate{root}, roots...)))
}

// CrossCert reads the cross certificate for root, made when root replaced
// the one before it. The error wraps fs.ErrNotExist for a root that was
// never rotated in (the first root, or an imported CA).
func (d KeyDir) CrossCert(root *x509.Certificate) (*x509.Certificate, error) {
	data, err := os.ReadFile(d.file(CrossCertFile(root)))
	if err != nil {
		return nil, fmt.Errorf("read cross certificate: %w", err)
	}
	certs, err := pki.ParseCertsPEM(data)
	if err != nil {
		return nil, fmt.Errorf("read cross certificate: %w", err)
	}
	cross := certs[0]
	if len(certs) != 1 || !bytes.Equal(cross.RawSubject, root.RawSubject) || !publicKeysEqual(root.PublicKey, cross.PublicKey) {
		return nil, fmt.Errorf("%s is not a cross certificate of root %s", CrossCertFile(root), root.Subject.CommonName)
	}
	return cross, nil
}

// IssueListenerCert makes a new P-256 key for the listener, has ca issue
// its certificate, and writes listener.key and listener.crt. The chain it
// returns (and writes) is the leaf, then the cross certificate of ca's root
// if there is one, then ca's intermediates: enough for an agent that knows
// only the current or only the previous root.
func (d KeyDir) IssueListenerCert(ca *CA, listener ListenerConfig, now time.Time) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("issue listener certificate: generate key: %w", err)
	}
	der, err := ca.IssueListener(key.Public(), listener.TrustDomain, listener.DNSNames, listener.IPs, now)
	if err != nil {
		return tls.Certificate{}, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("issue listener certificate: %w", err)
	}
	chain := []*x509.Certificate{leaf}
	cross, err := d.CrossCert(ca.Root())
	switch {
	case err == nil:
		chain = append(chain, cross)
	case !errors.Is(err, fs.ErrNotExist):
		return tls.Certificate{}, fmt.Errorf("issue listener certificate: %w", err)
	}
	chain = append(chain, ca.Intermediates()...)

	keyPEM, err := pki.MarshalPrivateKeyPEM(key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("issue listener certificate: %w", err)
	}
	// Key first: a crash between the two writes leaves a certificate that
	// does not match the key, which LoadOrCreateListenerCert replaces.
	if err := pki.WriteSecretFile(d.file(ListenerKeyFile), keyPEM); err != nil {
		return tls.Certificate{}, fmt.Errorf("issue listener certificate: %w", err)
	}
	if err := pki.WriteSecretFile(d.file(ListenerCertFile), pki.EncodeCertsPEM(chain)); err != nil {
		return tls.Certificate{}, fmt.Errorf("issue listener certificate: %w", err)
	}
	return tlsCertificate(chain, key), nil
}

func tlsCertificate(chain []*x509.Certificate, key crypto.Signer) tls.Certificate {
	raw := make([][]byte, len(chain))
	for i, c := range chain {
		raw[i] = c.Raw
	}
	return tls.Certificate{Certificate: raw, PrivateKey: key, Leaf: chain[0]}
}

// LoadListenerCert reads listener.key and listener.crt and checks that they
// match, that ca issued the leaf (ErrListenerCertStale if not) and that the
// chain verifies for server authentication at now under ca's root with the
// listener identity of trustDomain.
func (d KeyDir) LoadListenerCert(ca *CA, trustDomain string, now time.Time) (tls.Certificate, error) {
	chain, key, err := d.readCA(ListenerCertFile, ListenerKeyFile)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("load listener certificate: %w", err)
	}
	leaf := chain[0]
	if !publicKeysEqual(key.Public(), leaf.PublicKey) {
		return tls.Certificate{}, fmt.Errorf("load listener certificate: %s does not match %s", ListenerKeyFile, ListenerCertFile)
	}
	if !bytes.Equal(leaf.RawIssuer, ca.Cert().RawSubject) || leaf.CheckSignatureFrom(ca.Cert()) != nil {
		return tls.Certificate{}, fmt.Errorf("load listener certificate: %w", ErrListenerCertStale)
	}
	cert := tlsCertificate(chain, key)
	if _, _, err := pki.VerifyListenerChain(cert.Certificate, []*x509.Certificate{ca.Root()}, trustDomain, now); err != nil {
		return tls.Certificate{}, fmt.Errorf("load listener certificate: %w", err)
	}
	return cert, nil
}

// LoadOrCreateListenerCert returns the listener's certificate, issuing a
// new one under ca when the stored one is missing, broken, not ca's (after
// a rotation), for another trust domain, missing a cross certificate that
// now exists, or past two thirds of its lifetime. A new certificate keeps
// the DNS names and IPs of the old one, since only init is told the
// listener's endpoints. It reports whether it issued.
func (d KeyDir) LoadOrCreateListenerCert(ca *CA, trustDomain string, now time.Time) (cert tls.Certificate, issued bool, err error) {
	cert, loadErr := d.LoadListenerCert(ca, trustDomain, now)
	if loadErr == nil && !d.listenerCertDue(ca, cert, now) {
		return cert, false, nil
	}
	listener := ListenerConfig{TrustDomain: trustDomain}
	if chain, err := d.readListenerChain(); err == nil {
		listener.DNSNames, listener.IPs = chain[0].DNSNames, chain[0].IPAddresses
	}
	cert, err = d.IssueListenerCert(ca, listener, now)
	if err != nil {
		return tls.Certificate{}, false, err
	}
	return cert, true, nil
}

// listenerCertDue reports whether a valid listener certificate should
// still be replaced: it is past 2/3 of its life, or its chain differs from
// the one IssueListenerCert would build today.
func (d KeyDir) listenerCertDue(ca *CA, cert tls.Certificate, now time.Time) bool {
	leaf := cert.Leaf
	renewAt := leaf.NotBefore.Add(leaf.NotAfter.Sub(leaf.NotBefore) * 2 / 3)
	if !now.Before(renewAt) {
		return true
	}
	want := [][]byte{leaf.Raw}
	if cross, err := d.CrossCert(ca.Root()); err == nil {
		want = append(want, cross.Raw)
	}
	for _, c := range ca.Intermediates() {
		want = append(want, c.Raw)
	}
	if len(want) != len(cert.Certificate) {
		return true
	}
	for i := range want {
		if !bytes.Equal(want[i], cert.Certificate[i]) {
			return true
		}
	}
	return false
}

func (d KeyDir) readListenerChain() ([]*x509.Certificate, error) {
	data, err := os.ReadFile(d.file(ListenerCertFile))
	if err != nil {
		return nil, err
	}
	return pki.ParseCertsPEM(data)
}

// Rotate replaces the directory's root CA with a new one for trustDomain
// (see CA.Rotate) and re-issues the listener's certificate under it, with
// the cross certificate in its chain and the old certificate's names.
//
// Crash safety: the cross certificate, the new roots.pem (new root first)
// and the next CA (next-ca.crt, then next-ca.key) are written first; the
// rename of next-ca.key over ca.key is the commit point, then next-ca.crt
// is renamed over ca.crt. LoadCA completes a commit that a crash
// interrupted and discards a rotation that never reached it. The old CA
// key is gone once the rotation commits. If only the listener certificate
// fails, Rotate returns the new CA with the error; LoadOrCreateListenerCert
// issues it later.
func (d KeyDir) Rotate(trustDomain string, now time.Time) (*CA, tls.Certificate, error) {
	ca, err := d.LoadCA()
	if err != nil {
		return nil, tls.Certificate{}, fmt.Errorf("rotate: %w", err)
	}
	next, cross, err := ca.Rotate(trustDomain, now)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	if err := d.stageRotation(ca, next, cross); err != nil {
		return nil, tls.Certificate{}, fmt.Errorf("rotate: %w", err)
	}
	if err := d.commitRotation(); err != nil {
		return nil, tls.Certificate{}, fmt.Errorf("rotate: %w", err)
	}
	listener := ListenerConfig{TrustDomain: trustDomain}
	if chain, err := d.readListenerChain(); err == nil {
		listener.DNSNames, listener.IPs = chain[0].DNSNames, chain[0].IPAddresses
	}
	cert, err := d.IssueListenerCert(next, listener, now)
	if err != nil {
		return next, tls.Certificate{}, fmt.Errorf("rotate: ca rotated, listener certificate not re-issued: %w", err)
	}
	return next, cert, nil
}

func (d KeyDir) stageRotation(ca, next *CA, cross *x509.Certificate) error {
	if err := pki.WriteSecretFile(d.file(CrossCertFile(next.Root())), pki.EncodeCertsPEM([]*x509.Certificate{cross})); err != nil {
		return err
	}
	roots, err := d.Roots()
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	bundle := []*x509.Certificate{next.Root()}
	seen := map[string]bool{string(next.Root().Raw): true}
	for _, r := range append(roots, ca.Root()) {
		if !seen[string(r.Raw)] {
			seen[string(r.Raw)] = true
			bundle = append(bundle, r)
		}
	}
	if err := pki.WriteSecretFile(d.file(RootsFile), pki.EncodeCertsPEM(bundle)); err != nil {
		return err
	}
	keyPEM, err := pki.MarshalPrivateKeyPEM(next.signer)
	if err != nil {
		return err
	}
	if err := pki.WriteSecretFile(d.file(nextCACertFile), pki.EncodeCertsPEM(next.chain)); err != nil {
		return err
	}
	return pki.WriteSecretFile(d.file(nextCAKeyFile), keyPEM)
}

func (d KeyDir) commitRotation() error {
	if err := os.Rename(d.file(nextCAKeyFile), d.file(CAKeyFile)); err != nil {
		return err
	}
	if err := os.Rename(d.file(nextCACertFile), d.file(CACertFile)); err != nil {
		return err
	}
	return pki.SyncDir(d.Path)
}

// finishRotation brings the directory to a consistent state after a crash
// during Rotate. next-ca.key is staged last and renamed first, so while it
// exists the staging is complete and the commit has not begun: commit (or,
// if the staged pair is unreadable, discard it; the old CA is intact). A
// lone next-ca.crt is either a commit half done (ca.key already holds its
// key: finish it) or a staging cut short (discard it).
func (d KeyDir) finishRotation() error {
	_, keyErr := os.Lstat(d.file(nextCAKeyFile))
	_, certErr := os.Lstat(d.file(nextCACertFile))
	switch {
	case keyErr == nil:
		chain, key, err := d.readCA(nextCACertFile, nextCAKeyFile)
		if err != nil || !publicKeysEqual(key.Public(), chain[0].PublicKey) {
			return d.discardRotation()
		}
		return d.commitRotation()
	case certErr == nil:
		keyPEM, err := d.readSecret(CAKeyFile)
		if err != nil {
			return err
		}
		key, err := pki.ParsePrivateKeyPEM(keyPEM)
		if err != nil {
			return fmt.Errorf("%s: %w", CAKeyFile, err)
		}
		certPEM, err := os.ReadFile(d.file(nextCACertFile))
		if err != nil {
			return err
		}
		chain, err := pki.ParseCertsPEM(certPEM)
		if err != nil || !publicKeysEqual(key.Public(), chain[0].PublicKey) {
			return d.discardRotation()
		}
		if err := os.Rename(d.file(nextCACertFile), d.file(CACertFile)); err != nil {
			return err
		}
		return pki.SyncDir(d.Path)
	}
	return nil
}

func (d KeyDir) discardRotation() error {
	for _, name := range []string{nextCAKeyFile, nextCACertFile} {
		if err := os.Remove(d.file(name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return pki.SyncDir(d.Path)
}

// ListenerNames turns endpoints as given to init (--endpoint HOST:PORT, the
// port optional) into the DNS names and IPs of the listener certificate,
// without duplicates.
func ListenerNames(endpoints []string) (dnsNames []string, ips []net.IP, err error) {
	seen := map[string]bool{}
	for _, ep := range endpoints {
		host := ep
		if h, _, err := net.SplitHostPort(ep); err == nil {
			host = h
		}
		host = strings.ToLower(strings.Trim(host, "[]"))
		if seen[host] {
			continue
		}
		seen[host] = true
		if ip := net.ParseIP(host); ip != nil {
			if ip4 := ip.To4(); ip4 != nil {
				ip = ip4
			}
			ips = append(ips, ip)
			continue
		}
		if !validDNSName(host) {
			return nil, nil, fmt.Errorf("endpoint %q: %q is neither an ip address nor a host name", ep, host)
		}
		dnsNames = append(dnsNames, host)
	}
	return dnsNames, ips, nil
}
