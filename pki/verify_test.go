package pki_test

import (
	"crypto/x509"
	"testing"
	"time"

	"github.com/stratumjoin/stratum/pki"
	"github.com/stratumjoin/stratum/pki/authority"
	"github.com/stratumjoin/stratum/pki/pkitest"
)

// issueNode has ca issue a node certificate for a fresh key.
func issueNode(t *testing.T, ca *authority.CA) (der []byte, nodeID string) {
	t.Helper()
	csr, _ := pkitest.NewCSR(t, pkitest.CSROptions{})
	nodeID, err := pki.NodeID()
	if err != nil {
		t.Fatal(err)
	}
	der, err = ca.IssueNode(authority.NodeRequest{CSR: csr, NodeID: nodeID, TrustDomain: pkitest.TrustDomain, Role: pki.RoleNode})
	if err != nil {
		t.Fatal(err)
	}
	return der, nodeID
}

// A node certificate has serverAuth too; the agent's listener check must
// still refuse it, and the listener's node check must refuse the
// listener's certificate.
func TestIdentitiesDoNotCross(t *testing.T) {
	ca := pkitest.NewCA(t)
	roots := []*x509.Certificate{ca.Root()}
	nodeDER, nodeID := issueNode(t, ca)
	listenerDER, err := ca.IssueListener(pkitest.NewKey(t).Public(), pkitest.TrustDomain, nil, nil, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()

	if _, _, err := pki.VerifyListenerChain([][]byte{nodeDER}, roots, pkitest.TrustDomain, now); err == nil {
		t.Error("a node certificate passed as the listener")
	}
	if _, _, err := pki.VerifyListenerChain([][]byte{nodeDER}, roots, "", now); err == nil {
		t.Error("a node certificate passed as the listener of any trust domain")
	}
	if _, _, err := pki.VerifyListenerChain([][]byte{listenerDER}, roots, "other.example", now); err == nil {
		t.Error("the listener of another trust domain was accepted")
	}
	if _, err := pki.VerifyNodeChain([][]byte{listenerDER}, roots, pkitest.TrustDomain, now); err == nil {
		t.Error("the listener certificate passed as a node")
	}
	leaf, err := pki.VerifyNodeChain([][]byte{nodeDER}, roots, pkitest.TrustDomain, now)
	if err != nil {
		t.Fatalf("VerifyNodeChain: %v", err)
	}
	if id, _, _ := pki.NodeIdentity(leaf, pkitest.TrustDomain); id != nodeID {
		t.Errorf("node id %q, want %q", id, nodeID)
	}
	if _, err := pki.VerifyNodeChain([][]byte{nodeDER}, []*x509.Certificate{pkitest.NewCA(t).Root()}, pkitest.TrustDomain, now); err == nil {
		t.Error("a node certificate verified under a foreign root")
	}
	if _, err := pki.VerifyNodeChain([][]byte{nodeDER}, roots, pkitest.TrustDomain, now.Add(8*24*time.Hour)); err == nil {
		t.Error("an expired node certificate verified")
	}
}

// VerifyNodeChainAnchors names the roots the chain verified to, in the
// order given, and none it did not: an agent pins that root without
// verifying again per root.
func TestVerifyNodeChainAnchors(t *testing.T) {
	ca, other := pkitest.NewCA(t), pkitest.NewCA(t)
	nodeDER, _ := issueNode(t, ca)
	for _, roots := range [][]*x509.Certificate{{ca.Root(), other.Root()}, {other.Root(), ca.Root()}} {
		_, anchors, err := pki.VerifyNodeChainAnchors([][]byte{nodeDER}, roots, pkitest.TrustDomain, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if len(anchors) != 1 || !anchors[0].Equal(ca.Root()) {
			t.Errorf("anchors %d, want only the issuing root", len(anchors))
		}
	}
	if _, anchors, err := pki.VerifyNodeChainAnchors([][]byte{nodeDER}, []*x509.Certificate{other.Root()}, pkitest.TrustDomain, time.Now()); err == nil || anchors != nil {
		t.Errorf("under a foreign root: anchors %d, err %v", len(anchors), err)
	}
}
