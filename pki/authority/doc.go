// Package authority is Stratum Join's certificate authority: it makes or imports
// the cluster CA, issues node and listener certificates, rotates the root,
// and keeps the listener's key directory.
//
// The listener alone decides what a certificate says. A node's CSR
// contributes its public key and nothing else, once its self-signature
// checks out: subject, SANs, role, lifetime and key usages come from
// NodeRequest, so a joiner can never ask for a CA certificate, another
// node's name or a DNS name (the mistake behind Kubernetes CSR auto-approval
// and k3s CVE-2023-32187). Every certificate is checked by a validator
// (x509.Verify against the root, plus the expected names) before it leaves
// this package.
//
// Identities are SPIFFE URIs: spiffe://<trust-domain>/node/<nodeId> or
// spiffe://<trust-domain>/node-tenant/<nodeId> for nodes, and
// spiffe://<trust-domain>/listener for the listener, so a node certificate,
// which also carries serverAuth, can never pass for the listener.
//
// A CA's fingerprint is the SHA-256 of its root's DER; the join protocol's
// OPAQUE records commit to it. Rotation makes a new root and cross-signs it
// with the old one, so a listener certificate issued under the new root
// still verifies for an agent that only knows the old root, which then
// learns from the listener that its code is stale.
//
// KeyDir holds the CA and listener keys on disk as 0600 files in a 0700
// directory, written atomically (temporary file, fsync, rename).
package authority
