// Package agent is the node side of Stratum Join: the one-shot join, the
// service loop that keeps a node joined (renewal, approval, CA rotation),
// and the state directory that holds the node's key and pinned CA.
//
// The join secret never leaves this process: the agent proves it with
// OPAQUE, learns the cluster CA through the PAKE, checks the listener's
// QUIC certificate against it, and only then sends its CSR.
package agent

import (
	"bytes"
	"context"
	"crypto"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/quic-go/quic-go"

	"github.com/stratumjoin/stratum/internal/joincode"
	"github.com/stratumjoin/stratum/internal/pake"
	"github.com/stratumjoin/stratum/internal/tpm"
	"github.com/stratumjoin/stratum/internal/wire"
	"github.com/stratumjoin/stratum/pki"
)

// MaxPAKEFailures is how many failed PAKE exchanges the agent spends on
// one code before it gives up for good.
const MaxPAKEFailures = 3

// JoinConfig is what one join needs.
type JoinConfig struct {
	StateDir string
	// Endpoint, then Endpoints, are the listeners of the cluster: the agent
	// fails over from one to the next while none has answered.
	Endpoint  string
	Endpoints []string
	Secret    joincode.Secret
	// CAFingerprint, when set, must match the root learned through the PAKE.
	CAFingerprint string
	Facts         wire.Facts
	Logger        *slog.Logger
	Now           func() time.Time
	// OnPending is called when the listener holds the join for approval,
	// with the join's short authentication string, checked against the
	// agent's own.
	OnPending func(Pending)
	// DialTimeout bounds reaching the listener (default DefaultDialTimeout).
	DialTimeout time.Duration
	// Dial overrides the QUIC dial (tests use it to dial through a relay).
	Dial func(ctx context.Context, endpoint string, tlsConf *tls.Config, conf *quic.Config) (*quic.Conn, error)
	// ResultTimeout bounds each wait for the listener's next frame once
	// the Hello or the Proof is sent (default 2m); while a join is pending
	// the wait is what the listener announced it holds the join, plus a
	// minute.
	ResultTimeout time.Duration
	// TPM locates the TPM that holds the node key (a device path, or
	// "sim:HOST:PORT"); "" keeps the key in a file (docs/tpm.md).
	TPM string

	attestation *tpm.Attestation // the TPM's claim, sent with the Proof
	csr         []byte           // made before the attestation
	// lastRead is called once the final Result is read: nothing more
	// crosses the connection, so Join closes it then, not after the checks
	// and durable writes that follow (the listener holds a connection
	// until its agent closes it)
	lastRead func()
	// beforeSave, a test hook, runs before the credentials are written
	beforeSave func()
}

// Errors a join can end with. RefusedError carries the listener's reason.
var (
	// ErrNotAccepted: the PAKE failed; the code is wrong or the listener
	// is not the one that minted it. Nothing was sent after it.
	ErrNotAccepted = pake.ErrNotAccepted
	// ErrGaveUp: MaxPAKEFailures were spent on this code.
	ErrGaveUp = errors.New("gave up on this code after 3 failed attempts: check it, or ask for a new one")
	// ErrNotAuthentic: the listener proved the code but its QUIC
	// certificate does not chain to the CA the code commits to.
	ErrNotAuthentic = errors.New("the listener is not authentic: its certificate does not chain to the CA the code was minted under")
)

// RefusedError is a refusal the listener named: after a proven PAKE, or
// JOIN_UNAVAILABLE in place of a Challenge.
type RefusedError struct {
	Code    string
	Message string
	// RetryAfter is how long the listener asked to wait before a retry
	// (JOIN_UNAVAILABLE, JOIN_RATE_LIMITED); zero when it named none.
	RetryAfter time.Duration
}

func (e *RefusedError) Error() string { return e.Message + " (" + e.Code + ")" }

// Retryable reports whether trying again later may succeed.
func (e *RefusedError) Retryable() bool { return wire.Retryable(e.Code) }

// UnreachableError means the listener could not be reached or the
// connection broke: worth retrying.
type UnreachableError struct{ Err error }

func (e *UnreachableError) Error() string { return "could not reach the listener: " + e.Err.Error() }
func (e *UnreachableError) Unwrap() error { return e.Err }

// Joined is a successful join.
type Joined struct {
	Identity Identity
	Chain    []*x509.Certificate
}

func (c *JoinConfig) defaults() {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = DefaultDialTimeout
	}
	if c.ResultTimeout == 0 {
		c.ResultTimeout = 2 * time.Minute
	}
	if c.Dial == nil {
		c.Dial = func(ctx context.Context, ep string, t *tls.Config, q *quic.Config) (*quic.Conn, error) {
			return quic.DialAddr(ctx, ep, t, q)
		}
	}
}

// Join runs one join against cfg.Endpoint and, on success, writes the
// node's credentials into the state directory.
func Join(ctx context.Context, cfg JoinConfig) (*Joined, error) {
	cfg.defaults()
	st := State{Dir: cfg.StateDir}
	if n, err := st.failures(cfg.Secret.Locator); err != nil {
		return nil, err
	} else if n >= MaxPAKEFailures {
		return nil, ErrGaveUp
	}
	key, freshKey, tp, err := st.nodeKey(cfg.TPM)
	if err != nil {
		return nil, err
	}
	// A code's nonce is on disk before the Hello leaves: if this process
	// or the listener dies mid-join, the next attempt resumes it or a
	// proof claims it back (a token's or key's start is counted only if it
	// ends unproven, and never burns: its nonce stays in memory). A key made now is written in the same batch (one
	// directory sync for both): durable before the CSR that names it
	// leaves, so no certificate can outlive its key. The write runs while
	// the QUIC handshake is under way, which sends nothing of the join;
	// the Hello waits for it, and so does every return, so no write is
	// left in flight.
	nonce, commit, earlier, save, err := st.prepareAttempt(cfg.Secret.Locator, freshKey, cfg.Secret.Kind == joincode.KindCode)
	if err != nil {
		return nil, err
	}
	saved := make(chan error, 1)
	go func() { saved <- save() }()
	waitSaved := sync.OnceValue(func() error { return <-saved })
	defer waitSaved()
	if tp != nil {
		defer tp.Close()
		// the CSR first: the attestation then holds TPM slots until the
		// answer
		if cfg.csr, err = CSR(key); err != nil {
			return nil, err
		}
		att, err := tp.Attest(key.(*tpm.Key).Blobs())
		if err != nil {
			return nil, err
		}
		defer att.Close()
		cfg.attestation = att
	}
	tlsConf := &tls.Config{
		MinVersion: tls.VersionTLS13,
		NextProtos: []string{wire.ALPNJoin},
		// The CA is not known yet: it is learned through the PAKE, and
		// the certificate is checked against it before anything but the
		// OPAQUE messages is sent.
		InsecureSkipVerify: true,
	}
	// A join's connection lives a few round trips: path MTU probes (padded
	// packets the listener must read and acknowledge, one a join at the
	// end of every exchange) would find a larger MTU for nothing.
	qconf := &quic.Config{HandshakeIdleTimeout: cfg.DialTimeout, MaxIdleTimeout: 30 * time.Second, KeepAlivePeriod: 10 * time.Second, DisablePathMTUDiscovery: true}
	// Nothing of the join is sent before a handshake completes, so an
	// endpoint that is down costs no attempt.
	conn, ep, err := dialFirst(ctx, endpointList(cfg.Endpoint, cfg.Endpoints), FailoverDelay, func(ctx context.Context, ep string) (*quic.Conn, error) {
		dctx, cancel := context.WithTimeout(ctx, cfg.DialTimeout)
		defer cancel()
		return cfg.Dial(dctx, ep, tlsConf.Clone(), qconf.Clone())
	})
	if err != nil {
		return nil, &UnreachableError{err}
	}
	if err := waitSaved(); err != nil {
		conn.CloseWithError(quic.ApplicationErrorCode(wire.CloseDone), "")
		return nil, err
	}
	if ep != cfg.Endpoint {
		cfg.Logger.Info("joining through another endpoint", "endpoint", ep)
	}
	cfg.Endpoints = endpointList(ep, endpointList(cfg.Endpoint, cfg.Endpoints))
	cfg.Endpoint = ep
	defer conn.CloseWithError(quic.ApplicationErrorCode(wire.CloseDone), "")
	cfg.lastRead = func() { conn.CloseWithError(quic.ApplicationErrorCode(wire.CloseDone), "") }
	// quic-go detaches the connection from the dial's context: close it
	// when ctx ends, or a stop while the join waits for approval would
	// block on the read until the listener gives up.
	stop := context.AfterFunc(ctx, func() { conn.CloseWithError(quic.ApplicationErrorCode(wire.CloseDone), "") })
	defer stop()
	cs := conn.ConnectionState()
	exporter, err := wire.Exporter(cs.TLS)
	if err != nil {
		return nil, err
	}
	str, err := conn.OpenStreamSync(ctx)
	if err != nil {
		return nil, &UnreachableError{err}
	}
	var peer [][]byte
	for _, c := range cs.TLS.PeerCertificates {
		peer = append(peer, c.Raw)
	}
	j, err := exchange(ctx, str, exporter, peer, key, &cfg, attemptClaim{nonce: nonce, commit: commit, earlier: earlier})
	var refused *RefusedError
	switch {
	case err == nil, errors.As(err, &refused) && !refused.Retryable():
		// the listener recorded a proof of the code: the refunds are spent
		// (a join forgot them with its credentials already, and this finds
		// nothing to write)
		if ferr := st.finishAttempts(cfg.Secret.Locator); ferr != nil {
			cfg.Logger.Warn("forget attempt nonces", "err", ferr)
		}
	case errors.Is(err, ErrNotAccepted):
		// a failed PAKE is a failed attempt for good: nothing refunds it
		if ferr := st.dropAttempt(cfg.Secret.Locator, nonce); ferr != nil {
			cfg.Logger.Warn("forget attempt nonce", "err", ferr)
		}
	}
	if errors.Is(err, ErrNotAccepted) {
		conn.CloseWithError(quic.ApplicationErrorCode(wire.CloseNotProof), "")
		n, ferr := st.failures(cfg.Secret.Locator)
		if ferr == nil {
			ferr = st.setFailures(cfg.Secret.Locator, n+1)
		}
		if ferr != nil {
			return nil, fmt.Errorf("%w (and %w)", err, ferr)
		}
		if n+1 >= MaxPAKEFailures {
			return nil, fmt.Errorf("%w (%w)", ErrGaveUp, err)
		}
		return nil, err
	}
	if err != nil {
		return nil, err
	}
	// Joined: forgetting the count is tidying only. A count left behind
	// can only make the agent give up sooner on this code, never later.
	_ = st.setFailures(cfg.Secret.Locator, 0)
	return j, nil
}

// printable keeps the printable characters of an unauthenticated peer's
// message, so it cannot move the cursor or clear the operator's screen.
func printable(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsPrint(r) {
			return r
		}
		return -1
	}, s)
}

// exchange is the join protocol over one stream; QUIC is only its carrier.
// attemptClaim is what an attempt tells the listener about refunds: its
// own commitment, and the nonces of earlier unfinished attempts.
type attemptClaim struct {
	nonce   []byte // seeds the OPRF blind, so a repeated attempt repeats its guess
	commit  []byte
	earlier [][]byte
}

func exchange(ctx context.Context, str io.ReadWriter, exporter []byte, peerCerts [][]byte, key crypto.Signer, cfg *JoinConfig, claim attemptClaim) (*Joined, error) {
	// the password's copy is wiped once the exchange ends, so it does not
	// linger in the heap for the life of the service
	password := cfg.Secret.Password()
	defer clear(password)
	login, ke1, err := pake.StartSeeded(wire.BindingContext(exporter), cfg.Secret.Locator, password, claim.nonce)
	if err != nil {
		return nil, err
	}
	// every wait for the listener is bounded: one that goes silent must
	// not hold the agent for ever
	setDeadline := func(d time.Duration) {
		if ds, ok := str.(interface{ SetReadDeadline(time.Time) error }); ok {
			_ = ds.SetReadDeadline(time.Now().Add(d))
		}
	}
	if err := wire.Write(str, &wire.Hello{Version: wire.Version, Locator: cfg.Secret.Locator, KE1: ke1, Attempt: claim.commit}); err != nil {
		return nil, streamError(err)
	}
	setDeadline(cfg.ResultTimeout)
	var ch wire.Challenge
	typ, body, err := wire.ReadFrame(str)
	if err != nil {
		return nil, streamError(err)
	}
	if typ == wire.TypeResult {
		// a start refused before any KE2 (its source spent its budget of
		// unproven starts, or the listener cannot reach its store):
		// nothing was learnt on the code
		var res wire.Result
		if err := wire.Decode(typ, body, &res); err != nil || res.Status != wire.StatusRefused {
			return nil, fmt.Errorf("listener sent a malformed challenge: %w", err)
		}
		// Nothing authenticates the listener yet: only the retryable
		// JOIN_RATE_LIMITED and JOIN_UNAVAILABLE are taken from it here,
		// so a fake listener cannot make the agent give up its code for
		// good, and its words are shown printable only.
		if res.Code != wire.CodeRateLimited && res.Code != wire.CodeUnavailable {
			return nil, &UnreachableError{fmt.Errorf("the listener refused the start (%s) before proving it holds the code's record", res.Code)}
		}
		r := refusal(&res)
		r.RetryAfter = min(r.RetryAfter, maxRetryAfter)
		r.Message = printable(r.Message)
		if res.Code == wire.CodeUnavailable && !strings.HasPrefix(r.Message, "the listener") {
			r.Message = "the listener cannot reach its store: " + r.Message
		}
		return nil, r
	}
	if err := wire.Decode(typ, body, &ch); err != nil {
		return nil, fmt.Errorf("listener sent a malformed challenge: %w", err)
	}
	caChain, err := parseCerts(ch.CAChain)
	if err != nil {
		return nil, fmt.Errorf("listener sent a malformed CA chain: %w", err)
	}
	root := caChain[len(caChain)-1]
	fp := sha256.Sum256(root.Raw)
	if cfg.CAFingerprint != "" {
		want, err := pki.ParseFingerprint(cfg.CAFingerprint)
		if err != nil {
			return nil, fmt.Errorf("--ca-fingerprint: %w", err)
		}
		if want != fp {
			return nil, fmt.Errorf("%w: it presents CA %s, not the pinned %s", ErrNotAuthentic, pki.FormatFingerprint(fp), pki.FormatFingerprint(want))
		}
	}
	// A join code's 40 secret bits need the memory-hard KSF against a
	// stolen store; a listener that asks for none is not to be helped to
	// a cheaper offline search (docs/secrets.md).
	if cfg.Secret.Kind == joincode.KindCode {
		if err := ch.KSF.CheckArgon2id(); err != nil {
			return nil, fmt.Errorf("%w: it asks to stretch a join code with %w", ErrNotAuthentic, err)
		}
	}
	ke3, session, err := login.Finish(ch.KE2, fp[:], ch.KSF)
	if err != nil {
		return nil, err
	}
	// The PAKE proved the listener holds a record committing to this
	// root; now the QUIC server must chain to it too.
	raw := append(append([][]byte(nil), peerCerts...), ch.CAChain[:len(ch.CAChain)-1]...)
	_, trustDomain, err := pki.VerifyListenerChain(raw, []*x509.Certificate{root}, "", cfg.Now())
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNotAuthentic, err)
	}
	csr := cfg.csr
	if csr == nil {
		if csr, err = CSR(key); err != nil {
			return nil, err
		}
	}
	// The nonces go only to a listener that proved the code and chains to
	// its CA.
	proof := &wire.Proof{KE3: ke3, CSR: csr, Facts: cfg.Facts, Refunds: claim.earlier}
	if cfg.attestation != nil {
		proof.TPM = claimOf(cfg.attestation.Claim)
	}
	if err := wire.Write(str, proof); err != nil {
		return nil, streamError(err)
	}
	clear(password)
	setDeadline(cfg.ResultTimeout)
	for att := cfg.attestation; ; att = nil {
		var res wire.Result
		if err := readResult(str, att, &res); err != nil {
			return nil, err
		}
		switch res.Status {
		case wire.StatusPending:
			// The SAS comes from this PAKE session's key: a listener that
			// shows the approver other digits is not the end of this
			// session (or is not telling the approver what it holds).
			sas := pake.SAS(session, res.JoinID)
			if res.SAS != sas {
				return nil, fmt.Errorf("%w: the listener's short authentication string for join %s is not the one this session derives", ErrNotAuthentic, res.JoinID)
			}
			p := Pending{JoinID: res.JoinID, SAS: sas, Kind: cfg.Secret.Kind.String(), Endpoint: cfg.Endpoint, Since: cfg.Now().UTC()}
			_ = State{Dir: cfg.StateDir}.savePending(p)
			if cfg.OnPending != nil {
				cfg.OnPending(p)
			}
			if res.PendingFor > 0 {
				setDeadline(time.Duration(res.PendingFor)*time.Second + time.Minute)
			}
			continue
		case wire.StatusRefused:
			return nil, refusal(&res)
		}
		if cfg.lastRead != nil {
			cfg.lastRead()
		}
		return accept(&res, root, trustDomain, key, cfg)
	}
}

// maxRetryAfter caps the wait a listener may ask for before it has proved
// itself: the default budget window.
const maxRetryAfter = 10 * time.Minute

func refusal(res *wire.Result) *RefusedError {
	return &RefusedError{Code: res.Code, Message: res.Message, RetryAfter: time.Duration(res.RetryAfter) * time.Second}
}

// accept checks a joined Result and stores the credentials.
func accept(res *wire.Result, learnedRoot *x509.Certificate, trustDomain string, key crypto.Signer, cfg *JoinConfig) (*Joined, error) {
	chain, err := parseCerts(res.CertChain)
	if err != nil {
		return nil, fmt.Errorf("listener sent a malformed certificate: %w", err)
	}
	bundle, err := parseCerts(res.CABundle)
	if err != nil {
		return nil, fmt.Errorf("listener sent a malformed CA bundle: %w", err)
	}
	// The learned root stays pinned; the bundle may add the roots of a
	// rotation, which the authenticated listener vouches for.
	roots := []*x509.Certificate{learnedRoot}
	for _, r := range bundle {
		if !r.Equal(learnedRoot) {
			roots = append(roots, r)
		}
	}
	leaf, anchors, err := pki.VerifyNodeChainAnchors(res.CertChain, roots, trustDomain, cfg.Now())
	if err != nil {
		return nil, fmt.Errorf("listener issued a certificate that does not verify: %w", err)
	}
	if !publicKeyMatches(leaf, key) {
		return nil, errors.New("listener issued a certificate for another key")
	}
	nodeID, role, err := pki.NodeIdentity(leaf, trustDomain)
	if err != nil || nodeID != res.NodeID || role != res.Role {
		return nil, fmt.Errorf("listener's certificate names %s/%s, its result %s/%s", nodeID, role, res.NodeID, res.Role)
	}
	now := cfg.Now().UTC()
	// Pin the root that issued the certificate: the current one. A token
	// or key minted before a rotation proves the old root through the
	// PAKE; the authenticated listener's bundle then names the new one,
	// and the node certificate chains to it.
	pinned := learnedRoot
	for _, r := range bundle {
		if slices.ContainsFunc(anchors, r.Equal) {
			pinned = r
			break
		}
	}
	fp := sha256.Sum256(pinned.Raw)
	id := Identity{
		NodeID: res.NodeID, Role: res.Role, Trust: res.Trust, Endpoint: cfg.Endpoint, Endpoints: cfg.Endpoints, TrustDomain: trustDomain,
		CAFingerprint: pki.FormatFingerprint(fp), NotAfter: leaf.NotAfter, RenewAfter: time.Unix(res.RenewAfter, 0).UTC(),
		JoinedAt: now, Host: res.Host, TPM: cfg.TPM,
	}
	if cfg.beforeSave != nil {
		cfg.beforeSave()
	}
	if err := (State{Dir: cfg.StateDir}).saveCredentials(chain, roots, id, cfg.Secret.Locator); err != nil {
		return nil, err
	}
	return &Joined{Identity: id, Chain: chain}, nil
}

func parseCerts(der [][]byte) ([]*x509.Certificate, error) {
	out := make([]*x509.Certificate, 0, len(der))
	for _, d := range der {
		c, err := x509.ParseCertificate(d)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, errors.New("no certificates")
	}
	return out, nil
}

func publicKeyMatches(cert *x509.Certificate, key crypto.Signer) bool {
	a, err1 := x509.MarshalPKIXPublicKey(cert.PublicKey)
	b, err2 := x509.MarshalPKIXPublicKey(key.Public())
	return err1 == nil && err2 == nil && bytes.Equal(a, b)
}
