// Package pki holds what both sides of a join need of the cluster's PKI:
// secret files written atomically (0600 files in 0700 directories), PEM
// encoding and parsing of certificates and keys, CA fingerprints, node ids,
// the SPIFFE identities certificates carry, and the verification of the
// chains a node or the listener presents.
//
// Making certificates is the listener's alone and lives in pki/authority,
// so the agent links no CA code.
//
// Identities are SPIFFE URIs: spiffe://<trust-domain>/node/<nodeId> or
// spiffe://<trust-domain>/node-tenant/<nodeId> for nodes, and
// spiffe://<trust-domain>/listener for the listener. VerifyListenerChain
// requires the listener's URI, so a node certificate, which also carries
// serverAuth, can never pass for the listener.
//
// A CA's fingerprint is the SHA-256 of its root's DER; the join protocol's
// OPAQUE records commit to it.
package pki
