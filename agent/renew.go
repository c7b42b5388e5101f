package agent

import (
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/stratumjoin/stratum/internal/wire"
	"github.com/stratumjoin/stratum/pki"
)

// RenewConfig is what one renewal needs.
type RenewConfig struct {
	StateDir string
	Now      func() time.Time
	// DialTimeout bounds reaching the listener (default DefaultDialTimeout); Timeout
	// bounds the exchange that follows (default 1m), so a listener that
	// accepts and then hangs cannot stall the service loop.
	DialTimeout time.Duration
	Timeout     time.Duration
	// Dial overrides the QUIC dial (tests pick the source address).
	Dial func(ctx context.Context, endpoint string, tlsConf *tls.Config, conf *quic.Config) (*quic.Conn, error)
	// TPM locates the TPM that holds the node key when it is not where
	// the node joined with (node.json's tpm).
	TPM string
}

// Renew exchanges the node's current certificate (even one that expired
// while the machine was off) for a new one over mutual TLS, and pins the
// CA bundle the listener sends.
func Renew(ctx context.Context, cfg RenewConfig) (Identity, error) {
	ns, err := openNode(ctx, &cfg)
	if err != nil {
		return ns.id, err
	}
	defer ns.close()
	id, key, str, st := ns.id, ns.key, ns.str, ns.st
	csr, err := CSR(key)
	if err != nil {
		return id, &localError{err}
	}
	if err := wire.Write(str, &wire.Renew{CSR: csr}); err != nil {
		return id, streamError(err)
	}
	var res wire.Result
	if err := wire.Read(str, &res); err != nil {
		if errors.Is(err, wire.ErrFrame) {
			return id, fmt.Errorf("listener sent a malformed result: %w", err)
		}
		return id, streamError(err)
	}
	if res.Status != wire.StatusJoined {
		return id, refusal(&res)
	}
	newChain, err := parseCerts(res.CertChain)
	if err != nil {
		return id, fmt.Errorf("listener sent a malformed certificate: %w", err)
	}
	bundle, err := parseCerts(res.CABundle)
	if err != nil {
		return id, fmt.Errorf("listener sent a malformed CA bundle: %w", err)
	}
	// The new certificate must chain to a root we already trust or to one
	// the authenticated listener sends in the bundle.
	leaf, err := pki.VerifyNodeChain(res.CertChain, bundle, id.TrustDomain, cfg.Now())
	if err != nil {
		return id, fmt.Errorf("renewed certificate does not verify: %w", err)
	}
	if !publicKeyMatches(leaf, key) {
		return id, errors.New("listener renewed a certificate for another key")
	}
	if nodeID, _, err := pki.NodeIdentity(leaf, id.TrustDomain); err != nil || nodeID != id.NodeID {
		return id, fmt.Errorf("renewed certificate names node %q, not %q", nodeID, id.NodeID)
	}
	issuerRoot := rootOf(leaf, newChain, bundle)
	now := cfg.Now().UTC()
	id.NotAfter, id.RenewAfter, id.LastRenewal, id.LastError = leaf.NotAfter, time.Unix(res.RenewAfter, 0).UTC(), &now, ""
	id.Role, id.Trust = res.Role, res.Trust
	if issuerRoot != nil {
		id.CAFingerprint = pki.FormatFingerprint(pki.FingerprintOf(issuerRoot))
	}
	if err := st.saveCredentials(newChain, bundle, id, ""); err != nil {
		return id, &localError{err}
	}
	return id, nil
}

// nodeSession is one open stream on a mutually authenticated connection
// to the listener, under the node's current certificate.
type nodeSession struct {
	st    State
	id    Identity
	key   crypto.Signer
	str   *quic.Stream
	close func()
}

// openNode reads the node's identity and key and opens a stream to the
// first listener endpoint that answers. On error, ns.id is whatever was
// read (for the caller's messages) and nothing needs closing.
func openNode(ctx context.Context, cfg *RenewConfig) (ns nodeSession, err error) {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = DefaultDialTimeout
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = time.Minute
	}
	st := State{Dir: cfg.StateDir}
	id, ok, err := st.Identity()
	if err != nil {
		return nodeSession{id: id}, &localError{err}
	}
	if !ok {
		return nodeSession{id: id}, &localError{errors.New("not joined")}
	}
	locator := cfg.TPM
	if locator == "" {
		locator = id.TPM
	}
	key, fresh, tp, err := st.nodeKey(locator)
	if err == nil && fresh != nil {
		// a joined node that lost its key file: written now, as Key
		// writes a key it makes
		err = pki.WriteSecretFile(st.path(KeyFile), fresh.Data)
	}
	if err != nil {
		return nodeSession{id: id}, &localError{err}
	}
	closers := []func(){}
	cleanup := sync.OnceFunc(func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	})
	defer func() {
		if err != nil {
			cleanup()
		}
	}()
	if tp != nil {
		closers = append(closers, func() { tp.Close() })
		id.TPM = locator
	}
	chain, err := st.Chain()
	if err != nil {
		return nodeSession{id: id}, &localError{err}
	}
	roots, err := st.Roots()
	if err != nil {
		return nodeSession{id: id}, &localError{err}
	}
	tlsCert := tls.Certificate{PrivateKey: key, Leaf: chain[0]}
	for _, c := range chain {
		tlsCert.Certificate = append(tlsCert.Certificate, c.Raw)
	}
	tlsConf := &tls.Config{
		MinVersion:   tls.VersionTLS13,
		NextProtos:   []string{wire.ALPNNode},
		Certificates: []tls.Certificate{tlsCert},
		// Verified below against the pinned roots and the listener's
		// SPIFFE identity, not a host name.
		InsecureSkipVerify: true,
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			_, _, err := pki.VerifyListenerChain(raw, roots, id.TrustDomain, cfg.Now())
			return err
		},
	}
	// one request and its answer: no path MTU probes (see Join)
	qconf := &quic.Config{HandshakeIdleTimeout: cfg.DialTimeout, MaxIdleTimeout: 30 * time.Second, DisablePathMTUDiscovery: true}
	dial := cfg.Dial
	if dial == nil {
		dial = func(ctx context.Context, ep string, t *tls.Config, q *quic.Config) (*quic.Conn, error) {
			return quic.DialAddr(ctx, ep, t, q)
		}
	}
	conn, ep, err := dialFirst(ctx, endpointList(id.Endpoint, id.Endpoints), FailoverDelay, func(ctx context.Context, ep string) (*quic.Conn, error) {
		dctx, cancel := context.WithTimeout(ctx, cfg.DialTimeout)
		defer cancel()
		return dial(dctx, ep, tlsConf.Clone(), qconf.Clone())
	})
	if err != nil {
		return nodeSession{id: id}, &UnreachableError{err}
	}
	// The endpoint that answered is tried first next time.
	id.Endpoints = endpointList(ep, endpointList(id.Endpoint, id.Endpoints))
	id.Endpoint = ep
	closers = append(closers, func() { conn.CloseWithError(quic.ApplicationErrorCode(wire.CloseDone), "") })
	// quic-go detaches the connection from the dial's context: close it
	// when ctx ends so that a stop interrupts a read in flight.
	stop := context.AfterFunc(ctx, func() { conn.CloseWithError(quic.ApplicationErrorCode(wire.CloseDone), "") })
	closers = append(closers, func() { stop() })
	str, err := conn.OpenStreamSync(ctx)
	if err != nil {
		return nodeSession{id: id}, &UnreachableError{err}
	}
	if err := str.SetDeadline(time.Now().Add(cfg.Timeout)); err != nil {
		return nodeSession{id: id}, &UnreachableError{err}
	}
	return nodeSession{st: st, id: id, key: key, str: str, close: cleanup}, nil
}

// localError is a failure of this machine's own state (no identity, an
// unreadable key or certificate, a state directory it cannot write):
// trying the renewal again cannot fix it.
type localError struct{ err error }

func (e *localError) Error() string { return e.err.Error() }
func (e *localError) Unwrap() error { return e.err }

// rootOf finds the root in bundle that the leaf's chain ends at.
func rootOf(leaf *x509.Certificate, chain, bundle []*x509.Certificate) *x509.Certificate {
	pool := x509.NewCertPool()
	for _, r := range bundle {
		pool.AddCert(r)
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	chains, err := leaf.Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}, CurrentTime: leaf.NotBefore.Add(time.Minute)})
	if err != nil || len(chains) == 0 {
		return nil
	}
	c := chains[0]
	return c[len(c)-1]
}
