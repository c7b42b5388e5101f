package authority_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stratumjoin/stratum/pki"
	"github.com/stratumjoin/stratum/pki/authority"
	"github.com/stratumjoin/stratum/pki/pkitest"
)

func TestNewRootCA(t *testing.T) {
	now := time.Date(2026, 3, 4, 23, 30, 0, 0, time.FixedZone("x", -5*3600)) // 2026-03-05 in UTC
	ca, err := authority.NewRootCA("prod.example", now)
	if err != nil {
		t.Fatal(err)
	}
	root := ca.Root()
	if want := "Stratum Join Root CA prod.example 2026-03-05"; root.Subject.CommonName != want {
		t.Errorf("cn = %q, want %q", root.Subject.CommonName, want)
	}
	if !root.IsCA || !root.BasicConstraintsValid || root.MaxPathLen != 1 {
		t.Errorf("basic constraints: ca=%v valid=%v maxPathLen=%d, want CA with path length 1", root.IsCA, root.BasicConstraintsValid, root.MaxPathLen)
	}
	if root.KeyUsage&x509.KeyUsageCertSign == 0 {
		t.Error("root lacks keyCertSign")
	}
	if k, ok := root.PublicKey.(*ecdsa.PublicKey); !ok || k.Curve != elliptic.P256() {
		t.Errorf("root key %T, want ECDSA P-256", root.PublicKey)
	}
	if want := now.AddDate(10, 0, 0); !root.NotAfter.Equal(want.Truncate(time.Second)) {
		t.Errorf("not after %v, want %v", root.NotAfter, want)
	}
	if err := root.CheckSignatureFrom(root); err != nil {
		t.Errorf("not self-signed: %v", err)
	}
	if ca.Fingerprint() != sha256.Sum256(root.Raw) {
		t.Error("fingerprint is not the SHA-256 of the root's DER")
	}
	if len(ca.Chain()) != 1 || ca.Cert() != root || !ca.IsRoot() {
		t.Error("a new root's chain is not just the root")
	}
	if _, err := authority.NewRootCA("Not A Trust Domain", now); err == nil {
		t.Error("an invalid trust domain was accepted")
	}
}

func TestTwoRootsOfOneDayHaveDistinctNames(t *testing.T) {
	now := time.Now()
	a, err := authority.NewRootCA(pkitest.TrustDomain, now)
	if err != nil {
		t.Fatal(err)
	}
	b, err := authority.NewRootCA(pkitest.TrustDomain, now)
	if err != nil {
		t.Fatal(err)
	}
	if a.Root().Subject.CommonName != b.Root().Subject.CommonName {
		t.Fatal("CNs differ; the test assumes they are equal")
	}
	if a.Root().Subject.String() == b.Root().Subject.String() {
		t.Errorf("two roots share the subject %q", a.Root().Subject)
	}
}

func TestImportIntermediate(t *testing.T) {
	ext := pkitest.NewExternalCA(t)
	ca, err := authority.ImportCA(ext.ChainPEM, ext.KeyPEM)
	if err != nil {
		t.Fatalf("ImportCA: %v", err)
	}
	if !ca.Root().Equal(ext.Root) || !ca.Cert().Equal(ext.Intermediate) || len(ca.Chain()) != 2 || ca.IsRoot() {
		t.Fatal("imported chain is not [intermediate, root]")
	}
	if ca.Fingerprint() != sha256.Sum256(ext.Root.Raw) {
		t.Error("fingerprint is not the external root's")
	}
	if ca.Fingerprint() == sha256.Sum256(ext.Intermediate.Raw) {
		t.Error("fingerprint is the intermediate's")
	}

	csr, _ := pkitest.NewCSR(t, pkitest.CSROptions{})
	der, err := ca.IssueNode(authority.NodeRequest{CSR: csr, NodeID: mustNodeID(t), TrustDomain: pkitest.TrustDomain, Role: pki.RoleNode})
	if err != nil {
		t.Fatalf("IssueNode: %v", err)
	}
	node := mustParse(t, der)
	if out, ok := opensslVerify(t, "sslclient", ext.Root, node, ext.Intermediate); !ok {
		t.Errorf("openssl verify with -untrusted intermediate refused:\n%s", out)
	}
	if out, ok := opensslVerify(t, "sslclient", ext.Root, node); ok {
		t.Errorf("openssl verify accepted the node without its intermediate:\n%s", out)
	}
	if _, err := pki.VerifyNodeChain([][]byte{der, ext.Intermediate.Raw}, []*x509.Certificate{ext.Root}, pkitest.TrustDomain, time.Now()); err != nil {
		t.Errorf("VerifyNodeChain: %v", err)
	}

	if _, _, err := ca.Rotate(pkitest.TrustDomain, time.Now()); !errors.Is(err, authority.ErrNotRoot) {
		t.Errorf("Rotate of an intermediate: %v, want ErrNotRoot", err)
	}
}

func TestImportOwnRootRoundTrips(t *testing.T) {
	ca := pkitest.NewCA(t)
	keyPEM := exportKey(t, ca)
	again, err := authority.ImportCA(pki.EncodeCertsPEM(ca.Chain()), keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	if again.Fingerprint() != ca.Fingerprint() {
		t.Error("fingerprint changed")
	}
}

// exportKey gets a CA's key out the way an operator would: through a key
// directory.
func exportKey(t *testing.T, ca *authority.CA) []byte {
	t.Helper()
	dir := authority.KeyDir{Path: t.TempDir() + "/keys"}
	if _, err := dir.Init(ca, authority.ListenerConfig{TrustDomain: pkitest.TrustDomain}, time.Now()); err != nil {
		t.Fatal(err)
	}
	return readFile(t, dir.Path+"/"+authority.CAKeyFile)
}

func TestImportCARefuses(t *testing.T) {
	ext := pkitest.NewExternalCA(t)
	now := time.Now()
	otherKey := pkitest.NewKey(t)
	otherKeyPEM, err := pki.MarshalPrivateKeyPEM(otherKey)
	if err != nil {
		t.Fatal(err)
	}
	leafKey := pkitest.NewKey(t)
	leaf := pkitest.CreateCert(t, &x509.Certificate{
		SerialNumber: big.NewInt(10), Subject: pkix.Name{CommonName: "not a ca"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
	}, ext.Intermediate, leafKey.Public(), ext.IntermediateKey)
	leafKeyPEM, _ := pki.MarshalPrivateKeyPEM(leafKey)

	noSignKey := pkitest.NewKey(t)
	noSign := pkitest.CreateCert(t, &x509.Certificate{
		SerialNumber: big.NewInt(11), Subject: pkix.Name{CommonName: "ca without certSign"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		BasicConstraintsValid: true, IsCA: true, KeyUsage: x509.KeyUsageDigitalSignature,
	}, ext.Root, noSignKey.Public(), ext.RootKey)
	noSignKeyPEM, _ := pki.MarshalPrivateKeyPEM(noSignKey)

	emailOnlyKey := pkitest.NewKey(t)
	emailOnly := pkitest.CreateCert(t, &x509.Certificate{
		SerialNumber: big.NewInt(12), Subject: pkix.Name{CommonName: "email-only ca"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		BasicConstraintsValid: true, IsCA: true, KeyUsage: x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageEmailProtection},
	}, ext.Root, emailOnlyKey.Public(), ext.RootKey)
	emailOnlyKeyPEM, _ := pki.MarshalPrivateKeyPEM(emailOnlyKey)

	expiredKey := pkitest.NewKey(t)
	expired := pkitest.CreateCert(t, &x509.Certificate{
		SerialNumber: big.NewInt(13), Subject: pkix.Name{CommonName: "expired ca"},
		NotBefore: now.Add(-2 * time.Hour), NotAfter: now.Add(-time.Hour),
		BasicConstraintsValid: true, IsCA: true, KeyUsage: x509.KeyUsageCertSign,
	}, ext.Root, expiredKey.Public(), ext.RootKey)
	expiredKeyPEM, _ := pki.MarshalPrivateKeyPEM(expiredKey)

	foreignRoot := pkitest.NewExternalCA(t).Root

	tests := []struct {
		name    string
		certs   []*x509.Certificate
		keyPEM  []byte
		wantMsg string
	}{
		{"key does not match", []*x509.Certificate{ext.Intermediate, ext.Root}, otherKeyPEM, "key does not match"},
		{"no root in the chain", []*x509.Certificate{ext.Intermediate}, ext.KeyPEM, "self-signed root"},
		{"root first", []*x509.Certificate{ext.Root, ext.Intermediate}, ext.KeyPEM, "chain must run from the ca up to the root"},
		{"wrong root of the same name", []*x509.Certificate{ext.Intermediate, foreignRoot}, ext.KeyPEM, "is not signed by certificate 2"},
		{"not a ca", []*x509.Certificate{leaf, ext.Intermediate, ext.Root}, leafKeyPEM, "is not a CA"},
		{"no certSign", []*x509.Certificate{noSign, ext.Root}, noSignKeyPEM, "may not sign certificates"},
		{"restricted to email", []*x509.Certificate{emailOnly, ext.Root}, emailOnlyKeyPEM, "does not verify"},
		{"expired", []*x509.Certificate{expired, ext.Root}, expiredKeyPEM, "does not verify"},
		{"garbage key", []*x509.Certificate{ext.Intermediate, ext.Root}, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte{0x30, 0x03, 0x02, 0x01, 0x00}}), "parse private key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := authority.ImportCA(pki.EncodeCertsPEM(tt.certs), tt.keyPEM)
			if err == nil {
				t.Fatal("ImportCA accepted it")
			}
			if !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("error %q does not say %q", err, tt.wantMsg)
			}
			if strings.Contains(err.Error(), "PRIVATE KEY") || regexp.MustCompile(`[A-Za-z0-9+/]{40,}`).MatchString(err.Error()) {
				t.Errorf("error %q seems to quote key material", err)
			}
		})
	}
	if _, err := authority.ImportCA([]byte("garbage"), ext.KeyPEM); err == nil {
		t.Error("garbage certificate accepted")
	}
}

func TestRotate(t *testing.T) {
	old := pkitest.NewCA(t)
	now := time.Now()
	oldNodeCSR, _ := pkitest.NewCSR(t, pkitest.CSROptions{})
	oldNodeDER, err := old.IssueNode(authority.NodeRequest{CSR: oldNodeCSR, NodeID: mustNodeID(t), TrustDomain: pkitest.TrustDomain, Role: pki.RoleNode, Now: now})
	if err != nil {
		t.Fatal(err)
	}

	next, cross, err := old.Rotate(pkitest.TrustDomain, now)
	if err != nil {
		t.Fatalf("Rotate: %v", err)
	}
	if next.Fingerprint() == old.Fingerprint() {
		t.Fatal("rotation kept the fingerprint")
	}
	if !next.IsRoot() || next.Root().MaxPathLen != 1 {
		t.Error("the next CA is not a fresh root with path length 1")
	}
	if cross.Subject.String() != next.Root().Subject.String() || !next.Root().PublicKey.(*ecdsa.PublicKey).Equal(cross.PublicKey) {
		t.Error("cross certificate does not carry the new root's name and key")
	}
	if err := cross.CheckSignatureFrom(old.Root()); err != nil {
		t.Errorf("cross certificate not signed by the old root: %v", err)
	}
	if cross.NotAfter.After(old.Root().NotAfter) {
		t.Error("cross certificate outlives the old root")
	}

	listenerDER, err := next.IssueListener(pkitest.NewKey(t).Public(), pkitest.TrustDomain, nil, nil, now)
	if err != nil {
		t.Fatal(err)
	}
	listener := mustParse(t, listenerDER)
	presented := [][]byte{listenerDER, cross.Raw}

	tests := []struct {
		name  string
		chain [][]byte
		roots []*x509.Certificate
		ok    bool
	}{
		{"new leaf + cross under the old root alone", presented, []*x509.Certificate{old.Root()}, true},
		{"new leaf + cross under the new root alone", presented, []*x509.Certificate{next.Root()}, true},
		{"new leaf alone under the new root", presented[:1], []*x509.Certificate{next.Root()}, true},
		{"new leaf without cross under the old root", presented[:1], []*x509.Certificate{old.Root()}, false},
		{"new leaf + cross under an unrelated root", presented, []*x509.Certificate{pkitest.NewCA(t).Root()}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := pki.VerifyListenerChain(tt.chain, tt.roots, pkitest.TrustDomain, now)
			if (err == nil) != tt.ok {
				t.Errorf("VerifyListenerChain error = %v, want ok=%v", err, tt.ok)
			}
		})
	}
	for _, root := range []*x509.Certificate{old.Root(), next.Root()} {
		if out, ok := opensslVerify(t, "sslserver", root, listener, cross); !ok {
			t.Errorf("openssl verify under %s refused leaf+cross:\n%s", root.Subject.CommonName, out)
		}
	}

	bundle := []*x509.Certificate{next.Root(), old.Root()}
	if _, err := pki.VerifyNodeChain([][]byte{oldNodeDER}, bundle, pkitest.TrustDomain, now); err != nil {
		t.Errorf("a node certificate of the old CA no longer verifies under [new, old]: %v", err)
	}
	newCSR, _ := pkitest.NewCSR(t, pkitest.CSROptions{})
	newNodeDER, err := next.IssueNode(authority.NodeRequest{CSR: newCSR, NodeID: mustNodeID(t), TrustDomain: pkitest.TrustDomain, Role: pki.RoleNode, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pki.VerifyNodeChain([][]byte{newNodeDER}, bundle, pkitest.TrustDomain, now); err != nil {
		t.Errorf("a node certificate of the new CA does not verify under [new, old]: %v", err)
	}
}
