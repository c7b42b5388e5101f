package authority_test

import (
	"bytes"
	"crypto/x509"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stratumjoin/stratum/pki"
	"github.com/stratumjoin/stratum/pki/authority"
	"github.com/stratumjoin/stratum/pki/pkitest"
)

var testListener = authority.ListenerConfig{
	TrustDomain: pkitest.TrustDomain,
	DNSNames:    []string{"join.example.org"},
	IPs:         []net.IP{net.ParseIP("192.0.2.240").To4()},
}

func initDir(t *testing.T) (authority.KeyDir, *authority.CA) {
	t.Helper()
	dir := authority.KeyDir{Path: filepath.Join(t.TempDir(), "keys")}
	ca := pkitest.NewCA(t)
	if _, err := dir.Init(ca, testListener, time.Now()); err != nil {
		t.Fatalf("Init: %v", err)
	}
	return dir, ca
}

func TestKeyDirInit(t *testing.T) {
	dir, ca := initDir(t)

	if m := pkitest.FileMode(t, dir.Path); m != 0o700 {
		t.Errorf("directory mode %#o, want 0700", m)
	}
	names := []string{authority.CACertFile, authority.CAKeyFile, authority.ListenerCertFile, authority.ListenerKeyFile, authority.RootsFile}
	for _, name := range names {
		if m := pkitest.FileMode(t, filepath.Join(dir.Path, name)); m != 0o600 {
			t.Errorf("%s mode %#o, want 0600", name, m)
		}
	}
	slices.Sort(names)
	pkitest.AssertOnly(t, dir.Path, names...)

	loaded, err := dir.LoadCA()
	if err != nil {
		t.Fatalf("LoadCA: %v", err)
	}
	if loaded.Fingerprint() != ca.Fingerprint() || !loaded.Cert().Equal(ca.Cert()) {
		t.Error("LoadCA returned another CA")
	}
	// The loaded key signs certificates the original root accepts.
	csr, _ := pkitest.NewCSR(t, pkitest.CSROptions{})
	der, err := loaded.IssueNode(authority.NodeRequest{CSR: csr, NodeID: mustNodeID(t), TrustDomain: pkitest.TrustDomain, Role: pki.RoleNode})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pki.VerifyNodeChain([][]byte{der}, []*x509.Certificate{ca.Root()}, pkitest.TrustDomain, time.Now()); err != nil {
		t.Errorf("node certificate from the loaded CA: %v", err)
	}

	roots, err := dir.Roots()
	if err != nil || len(roots) != 1 || !roots[0].Equal(ca.Root()) {
		t.Errorf("Roots = %d roots, %v; want just the root", len(roots), err)
	}
	cert, err := dir.LoadListenerCert(loaded, pkitest.TrustDomain, time.Now())
	if err != nil {
		t.Fatalf("LoadListenerCert: %v", err)
	}
	if len(cert.Certificate) != 1 || !slices.Equal(cert.Leaf.DNSNames, testListener.DNSNames) {
		t.Errorf("listener chain of %d, names %v", len(cert.Certificate), cert.Leaf.DNSNames)
	}
}

func TestKeyDirInitRefusesToOverwrite(t *testing.T) {
	dir, _ := initDir(t)
	before := map[string][]byte{}
	for _, name := range []string{authority.CAKeyFile, authority.CACertFile, authority.RootsFile, authority.ListenerKeyFile, authority.ListenerCertFile} {
		before[name] = readFile(t, filepath.Join(dir.Path, name))
	}
	if _, err := dir.Init(pkitest.NewCA(t), testListener, time.Now()); !errors.Is(err, authority.ErrInitialized) {
		t.Fatalf("second Init error = %v, want ErrInitialized", err)
	}
	for name, want := range before {
		if !bytes.Equal(readFile(t, filepath.Join(dir.Path, name)), want) {
			t.Errorf("second Init changed %s", name)
		}
	}

	// A lone ca.key (an init cut short) is refused just the same.
	lone := authority.KeyDir{Path: privateDir(t)}
	if err := pki.WriteSecretFile(filepath.Join(lone.Path, authority.CAKeyFile), before[authority.CAKeyFile]); err != nil {
		t.Fatal(err)
	}
	if _, err := lone.Init(pkitest.NewCA(t), testListener, time.Now()); !errors.Is(err, authority.ErrInitialized) {
		t.Errorf("Init over a lone ca.key: %v, want ErrInitialized", err)
	}
}

func TestKeyDirInitUndoesAFailure(t *testing.T) {
	dir := authority.KeyDir{Path: privateDir(t)}
	bad := testListener
	bad.DNSNames = []string{"*.wildcard.example"}
	if _, err := dir.Init(pkitest.NewCA(t), bad, time.Now()); !errors.Is(err, authority.ErrInvalidRequest) {
		t.Fatalf("Init with a wildcard listener name: %v, want ErrInvalidRequest", err)
	}
	pkitest.AssertOnly(t, dir.Path)
	if _, err := dir.Init(pkitest.NewCA(t), testListener, time.Now()); err != nil {
		t.Fatalf("Init after a failed one: %v", err)
	}
}

func TestKeyDirRefusesExposedKey(t *testing.T) {
	dir, _ := initDir(t)
	if err := os.Chmod(filepath.Join(dir.Path, authority.CAKeyFile), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := dir.LoadCA(); err == nil || !strings.Contains(err.Error(), "must be 0600") {
		t.Fatalf("LoadCA with a 0644 ca.key: %v", err)
	}
}

func TestKeyDirImportedIntermediate(t *testing.T) {
	ext := pkitest.NewExternalCA(t)
	ca, err := authority.ImportCA(ext.ChainPEM, ext.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	dir := authority.KeyDir{Path: filepath.Join(t.TempDir(), "keys")}
	cert, err := dir.Init(ca, testListener, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	// The listener presents its leaf and the intermediate, so an agent
	// holding only the external root verifies it.
	if len(cert.Certificate) != 2 || !bytes.Equal(cert.Certificate[1], ext.Intermediate.Raw) {
		t.Fatalf("listener chain has %d certificates, want leaf + intermediate", len(cert.Certificate))
	}
	if _, _, err := pki.VerifyListenerChain(cert.Certificate, []*x509.Certificate{ext.Root}, pkitest.TrustDomain, time.Now()); err != nil {
		t.Errorf("listener chain under the external root: %v", err)
	}
	loaded, err := dir.LoadCA()
	if err != nil {
		t.Fatal(err)
	}
	if loaded.Fingerprint() != ca.Fingerprint() || len(loaded.Chain()) != 2 {
		t.Error("imported CA did not round-trip")
	}
	if _, _, err := dir.Rotate(pkitest.TrustDomain, time.Now()); !errors.Is(err, authority.ErrNotRoot) {
		t.Errorf("Rotate of an imported intermediate: %v, want ErrNotRoot", err)
	}
}

func TestKeyDirRotate(t *testing.T) {
	dir, old := initDir(t)
	now := time.Now()
	next, cert, err := dir.Rotate(pkitest.TrustDomain, now)
	if err != nil {
		t.Fatalf("Rotate: %v", err)
	}

	roots, err := dir.Roots()
	if err != nil || len(roots) != 2 || !roots[0].Equal(next.Root()) || !roots[1].Equal(old.Root()) {
		t.Fatalf("roots.pem after rotation: %d roots (%v), want [new, old]", len(roots), err)
	}
	loaded, err := dir.LoadCA()
	if err != nil || loaded.Fingerprint() != next.Fingerprint() {
		t.Fatalf("LoadCA after rotation: %v, or the old CA", err)
	}
	cross, err := dir.CrossCert(next.Root())
	if err != nil {
		t.Fatalf("CrossCert: %v", err)
	}
	if len(cert.Certificate) != 2 || !bytes.Equal(cert.Certificate[1], cross.Raw) {
		t.Fatalf("listener chain has %d certificates, want leaf + cross", len(cert.Certificate))
	}
	if !slices.Equal(cert.Leaf.DNSNames, testListener.DNSNames) || !slices.EqualFunc(cert.Leaf.IPAddresses, testListener.IPs, net.IP.Equal) {
		t.Errorf("re-issued listener names %v %v, want the old ones", cert.Leaf.DNSNames, cert.Leaf.IPAddresses)
	}
	for _, root := range []*x509.Certificate{old.Root(), next.Root()} {
		if _, _, err := pki.VerifyListenerChain(cert.Certificate, []*x509.Certificate{root}, pkitest.TrustDomain, now); err != nil {
			t.Errorf("listener chain under %s alone: %v", root.Subject.CommonName, err)
		}
	}
	stored, err := dir.LoadListenerCert(loaded, pkitest.TrustDomain, now)
	if err != nil {
		t.Fatalf("LoadListenerCert: %v", err)
	}
	if !slices.EqualFunc(stored.Certificate, cert.Certificate, bytes.Equal) {
		t.Error("stored listener chain differs from the one Rotate returned")
	}
	for _, name := range []string{authority.CrossCertFile(next.Root()), authority.RootsFile, authority.CAKeyFile, authority.CACertFile} {
		if m := pkitest.FileMode(t, filepath.Join(dir.Path, name)); m != 0o600 {
			t.Errorf("%s mode %#o, want 0600", name, m)
		}
	}
	if _, err := dir.LoadListenerCert(old, pkitest.TrustDomain, now); !errors.Is(err, authority.ErrListenerCertStale) {
		t.Errorf("listener cert checked against the old CA: %v, want ErrListenerCertStale", err)
	}

	// A second rotation: the chain carries only the newest cross, and the
	// bundle lists all three roots, newest first.
	third, cert3, err := dir.Rotate(pkitest.TrustDomain, now)
	if err != nil {
		t.Fatal(err)
	}
	roots, _ = dir.Roots()
	if len(roots) != 3 || !roots[0].Equal(third.Root()) || !roots[2].Equal(old.Root()) {
		t.Errorf("roots after two rotations: %d", len(roots))
	}
	if _, _, err := pki.VerifyListenerChain(cert3.Certificate, []*x509.Certificate{next.Root()}, pkitest.TrustDomain, now); err != nil {
		t.Errorf("after two rotations, the previous root: %v", err)
	}
}

func TestLoadOrCreateListenerCert(t *testing.T) {
	dir, ca := initDir(t)
	now := time.Now()

	first, issued, err := dir.LoadOrCreateListenerCert(ca, pkitest.TrustDomain, now)
	if err != nil || issued {
		t.Fatalf("fresh directory: issued=%v err=%v, want the stored certificate", issued, err)
	}

	late := now.Add(250 * 24 * time.Hour) // past 2/3 of a year
	renewed, issued, err := dir.LoadOrCreateListenerCert(ca, pkitest.TrustDomain, late)
	if err != nil || !issued {
		t.Fatalf("past 2/3 of its life: issued=%v err=%v, want a new certificate", issued, err)
	}
	if renewed.Leaf.SerialNumber.Cmp(first.Leaf.SerialNumber) == 0 || !slices.Equal(renewed.Leaf.DNSNames, testListener.DNSNames) {
		t.Error("renewed certificate is the old one, or lost its names")
	}

	if err := os.Remove(filepath.Join(dir.Path, authority.ListenerKeyFile)); err != nil {
		t.Fatal(err)
	}
	again, issued, err := dir.LoadOrCreateListenerCert(ca, pkitest.TrustDomain, now)
	if err != nil || !issued || !slices.Equal(again.Leaf.DNSNames, testListener.DNSNames) {
		t.Fatalf("missing key: issued=%v err=%v names=%v", issued, err, again.Leaf.DNSNames)
	}
	if _, err := dir.LoadListenerCert(ca, pkitest.TrustDomain, now); err != nil {
		t.Errorf("the re-issued certificate does not load: %v", err)
	}
}

func TestListenerNames(t *testing.T) {
	dns, ips, err := authority.ListenerNames([]string{"join.example.org:9444", "192.0.2.240:9444", "[2001:db8::1]:9444", "JOIN.example.org", "localhost"})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"join.example.org", "localhost"}; !slices.Equal(dns, want) {
		t.Errorf("dns names %v, want %v", dns, want)
	}
	if want := []net.IP{net.ParseIP("192.0.2.240"), net.ParseIP("2001:db8::1")}; !slices.EqualFunc(ips, want, net.IP.Equal) {
		t.Errorf("ips %v, want %v", ips, want)
	}
	if _, _, err := authority.ListenerNames([]string{"bad host:9444"}); err == nil {
		t.Error("a host name with a space was accepted")
	}
}
