package pki

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"
)

// Roles a node certificate can carry: the first path segment of its URI SAN.
const (
	RoleNode       = "node"
	RoleNodeTenant = "node-tenant"
)

// ValidTrustDomain reports whether s is a SPIFFE trust domain name:
// 1 to 255 characters of lowercase letters, digits, '.', '-' and '_'.
func ValidTrustDomain(s string) bool {
	if len(s) == 0 || len(s) > 255 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// ListenerIdentity is the URI SAN of the listener's certificate. The agent
// requires it on the QUIC leaf: node certificates also carry serverAuth and
// must not pass for the listener.
func ListenerIdentity(trustDomain string) string {
	return "spiffe://" + trustDomain + "/listener"
}

// NodeURI is the URI SAN of a node certificate:
// spiffe://<td>/node/<id> for RoleNode, spiffe://<td>/node-tenant/<id> for
// RoleNodeTenant.
func NodeURI(trustDomain, role, nodeID string) string {
	return "spiffe://" + trustDomain + "/" + role + "/" + nodeID
}

// NodeIdentity reads a node certificate's identity: its one URI SAN must be
// a node URI in trustDomain with a valid node id that is also its CN.
func NodeIdentity(cert *x509.Certificate, trustDomain string) (nodeID, role string, err error) {
	if len(cert.URIs) != 1 {
		return "", "", fmt.Errorf("node certificate has %d uri sans, want 1", len(cert.URIs))
	}
	u := cert.URIs[0]
	td, path, err := spiffeParts(u)
	if err != nil {
		return "", "", fmt.Errorf("node certificate: %w", err)
	}
	if td != trustDomain {
		return "", "", fmt.Errorf("node certificate is for trust domain %q, want %q", td, trustDomain)
	}
	role, nodeID, ok := strings.Cut(strings.TrimPrefix(path, "/"), "/")
	if !ok || (role != RoleNode && role != RoleNodeTenant) || !ValidNodeID(nodeID) {
		return "", "", fmt.Errorf("node certificate uri %q is not a node identity", u.String())
	}
	if cert.Subject.CommonName != nodeID {
		return "", "", fmt.Errorf("node certificate cn %q differs from its uri's node id", cert.Subject.CommonName)
	}
	return nodeID, role, nil
}

// spiffeParts splits a SPIFFE ID into trust domain and path, refusing
// anything a SPIFFE ID may not have.
func spiffeParts(u *url.URL) (trustDomain, path string, err error) {
	if u.Scheme != "spiffe" || u.Opaque != "" || u.User != nil || u.Port() != "" ||
		u.RawQuery != "" || u.Fragment != "" || u.ForceQuery || u.RawPath != "" {
		return "", "", fmt.Errorf("uri %q is not a spiffe id", u.String())
	}
	if !ValidTrustDomain(u.Host) {
		return "", "", fmt.Errorf("uri %q has an invalid trust domain", u.String())
	}
	return u.Host, u.Path, nil
}

// VerifyNodeChain checks a certificate chain a node presents (leaf first,
// as in tls.Config.VerifyPeerCertificate) against roots for client
// authentication at now, and that the leaf is a node certificate of
// trustDomain. It returns the leaf; NodeIdentity reads its id and role.
func VerifyNodeChain(rawCerts [][]byte, roots []*x509.Certificate, trustDomain string, now time.Time) (*x509.Certificate, error) {
	leaf, _, err := VerifyNodeChainAnchors(rawCerts, roots, trustDomain, now)
	return leaf, err
}

// VerifyNodeChainAnchors is VerifyNodeChain that also returns the roots
// the chain verified to, each once, in the order of roots: an agent pins
// the one that issued its certificate without verifying the chain again
// against each root.
func VerifyNodeChainAnchors(rawCerts [][]byte, roots []*x509.Certificate, trustDomain string, now time.Time) (leaf *x509.Certificate, anchors []*x509.Certificate, err error) {
	leaf, chains, err := verifyChain(rawCerts, roots, x509.ExtKeyUsageClientAuth, now)
	if err != nil {
		return nil, nil, fmt.Errorf("verify node: %w", err)
	}
	if _, _, err := NodeIdentity(leaf, trustDomain); err != nil {
		return nil, nil, fmt.Errorf("verify node: %w", err)
	}
	for _, r := range roots {
		for _, c := range chains {
			if c[len(c)-1].Equal(r) {
				anchors = append(anchors, r)
				break
			}
		}
	}
	return leaf, anchors, nil
}

// VerifyListenerChain checks the chain a listener presents against roots
// (for an agent, the root it learned through the PAKE) for server
// authentication at now, and that the leaf's only URI SAN is
// ListenerIdentity. An empty trustDomain accepts the listener of any trust
// domain, for an agent that does not know it yet; the trust domain found is
// returned.
func VerifyListenerChain(rawCerts [][]byte, roots []*x509.Certificate, trustDomain string, now time.Time) (leaf *x509.Certificate, td string, err error) {
	leaf, _, err = verifyChain(rawCerts, roots, x509.ExtKeyUsageServerAuth, now)
	if err != nil {
		return nil, "", fmt.Errorf("verify listener: %w", err)
	}
	if len(leaf.URIs) != 1 {
		return nil, "", fmt.Errorf("verify listener: leaf has %d uri sans, want 1", len(leaf.URIs))
	}
	td, path, err := spiffeParts(leaf.URIs[0])
	if err != nil {
		return nil, "", fmt.Errorf("verify listener: %w", err)
	}
	if path != "/listener" || (trustDomain != "" && td != trustDomain) {
		return nil, "", fmt.Errorf("verify listener: leaf identity %q is not the listener's", leaf.URIs[0].String())
	}
	return leaf, td, nil
}

func verifyChain(rawCerts [][]byte, roots []*x509.Certificate, usage x509.ExtKeyUsage, now time.Time) (*x509.Certificate, [][]*x509.Certificate, error) {
	if len(rawCerts) == 0 {
		return nil, nil, errors.New("no certificate presented")
	}
	if len(roots) == 0 {
		return nil, nil, errors.New("no trusted root")
	}
	certs := make([]*x509.Certificate, len(rawCerts))
	for i, raw := range rawCerts {
		c, err := x509.ParseCertificate(raw)
		if err != nil {
			return nil, nil, fmt.Errorf("parse certificate %d: %w", i+1, err)
		}
		certs[i] = c
	}
	leaf := certs[0]
	if !leaf.BasicConstraintsValid || leaf.IsCA {
		return nil, nil, errors.New("leaf is not an end-entity certificate")
	}
	opts := x509.VerifyOptions{
		Roots:         x509.NewCertPool(),
		Intermediates: x509.NewCertPool(),
		CurrentTime:   now,
		KeyUsages:     []x509.ExtKeyUsage{usage},
	}
	for _, r := range roots {
		opts.Roots.AddCert(r)
	}
	for _, c := range certs[1:] {
		opts.Intermediates.AddCert(c)
	}
	chains, err := leaf.Verify(opts)
	if err != nil {
		return nil, nil, err
	}
	return leaf, chains, nil
}
