package listener

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/stratumjoin/stratum/internal/cluster"
	"github.com/stratumjoin/stratum/internal/wire"
	"github.com/stratumjoin/stratum/pki"
	"github.com/stratumjoin/stratum/pki/authority"
)

// renew serves one renewal on a mutually authenticated connection.
func (l *Listener) renew(ctx context.Context, str Stream, peer []*x509.Certificate) wire.CloseCode {
	code, err := l.Renew(ctx, str, peer)
	if err != nil {
		l.logger.Info("renewal failed", "remote", remoteAddr(ctx), "err", err)
	}
	return code
}

// Renew runs the renewal exchange: the peer chain must verify under one of
// the cluster's roots for client authentication; a certificate that merely
// expired (the machine was off) is accepted if the node still stands.
func (l *Listener) Renew(ctx context.Context, str Stream, peer []*x509.Certificate) (wire.CloseCode, error) {
	// A certificate the listener cannot accept is refused by name, after
	// the request is read, so the agent knows not to retry.
	refuse := func(msg string, cause error) (wire.CloseCode, error) {
		if _, _, err := l.readNodeRequest(str); err != nil {
			return wire.CloseAuth, fmt.Errorf("%s: %w", msg, cause)
		}
		res := &wire.Result{Status: wire.StatusRefused, Code: wire.CodeCertInvalid, Message: msg + "; join again with a new code"}
		l.metrics.renewal(res, nil)
		_ = wire.Write(str, res)
		return wire.CloseDone, fmt.Errorf("%s: %w", msg, cause)
	}
	if len(peer) == 0 {
		return refuse("the renewal carried no node certificate", errors.New("no client certificate"))
	}
	raw := certsDER(peer)
	roots := l.Roots()
	leaf, err := pki.VerifyNodeChain(raw, roots, l.settings.TrustDomain, l.now())
	if err != nil && l.now().After(peer[0].NotAfter.Add(l.cfg.RenewGrace)) {
		// expired longer ago than the grace: a machine switched off over a
		// long weekend renews, a decommissioned one needs a new code
		if verr := l.verifiesBeforeExpiry(raw, roots, peer[0]); verr == nil {
			return l.refuseExpired(str, peer[0].NotAfter)
		}
	}
	if err != nil && l.now().After(peer[0].NotAfter) {
		// verify as of just before it expired
		leaf, err = pki.VerifyNodeChain(raw, roots, l.settings.TrustDomain, peer[0].NotAfter.Add(-time.Second))
	}
	if err != nil {
		return refuse("this node's certificate is not one this cluster issued", err)
	}
	nodeID, _, err := pki.NodeIdentity(leaf, l.settings.TrustDomain)
	if err != nil {
		return refuse("this node's certificate names no node of this cluster", err)
	}
	req, leave, err := l.readNodeRequest(str)
	if err != nil {
		return wire.CloseProtocol, fmt.Errorf("read renew: %w", err)
	}
	if leave {
		return l.leave(ctx, str, nodeID, serialHex(leaf.SerialNumber))
	}
	csr, err := authority.ParseCSR(req.CSR)
	if err != nil {
		res := &wire.Result{Status: wire.StatusRefused, Code: wire.CodeBadCSR, Message: "the certificate request is malformed or its signature does not verify"}
		l.metrics.renewal(res, nil)
		return wire.CloseDone, wire.Write(str, res)
	}
	keyFP := sha256.Sum256(csr.RawSubjectPublicKeyInfo())
	t0 := time.Now()
	out, err := l.cluster.Renew(ctx, cluster.RenewRequest{NodeID: nodeID, Serial: serialHex(leaf.SerialNumber), KeyFP: hex.EncodeToString(keyFP[:]), Issue: l.issuer(csr)})
	l.metrics.storeOp("renew", t0, err)
	if errors.Is(err, authority.ErrInvalidCSR) {
		// a weak key or a type we do not accept: named, and read by the
		// agent before the connection closes
		res := &wire.Result{Status: wire.StatusRefused, Code: wire.CodeBadCSR, Message: "the certificate request's key is not one this cluster accepts: " + err.Error()}
		l.metrics.renewal(res, nil)
		return wire.CloseDone, wire.Write(str, res)
	}
	if err != nil {
		l.metrics.renewal(nil, err)
		l.logger.Warn("record renewal", "nodeId", nodeID, "err", err)
		return wire.CloseDone, errors.Join(err, wire.Write(str, l.unavailable(err)))
	}
	res := l.result(out)
	l.metrics.renewal(res, nil)
	return wire.CloseDone, wire.Write(str, res)
}

func (l *Listener) verifiesBeforeExpiry(raw [][]byte, roots []*x509.Certificate, leaf *x509.Certificate) error {
	_, err := pki.VerifyNodeChain(raw, roots, l.settings.TrustDomain, leaf.NotAfter.Add(-time.Second))
	return err
}

// refuseExpired reads the request and refuses it NODE_CERT_EXPIRED.
func (l *Listener) refuseExpired(str Stream, notAfter time.Time) (wire.CloseCode, error) {
	if _, _, err := l.readNodeRequest(str); err != nil {
		return wire.CloseAuth, fmt.Errorf("read renew: %w", err)
	}
	msg := fmt.Sprintf("this node's certificate expired at %s, longer ago than the %s this cluster renews after expiry; join it again with a new code", notAfter.UTC().Format(time.RFC3339), l.cfg.RenewGrace)
	return wire.CloseDone, wire.Write(str, &wire.Result{Status: wire.StatusRefused, Code: wire.CodeCertExpired, Message: msg})
}

// readNodeRequest reads the one request of a node connection: a Renew, or
// a Leave (leave is true, req nil).
func (l *Listener) readNodeRequest(str Stream) (req *wire.Renew, leave bool, err error) {
	defer l.waitOnPeer()()
	str.SetReadDeadline(time.Now().Add(helloTimeout))
	typ, body, err := wire.ReadFrame(str)
	if err != nil {
		return nil, false, err
	}
	if typ == wire.TypeLeave {
		return nil, true, wire.Decode(typ, body, &wire.Leave{})
	}
	req = &wire.Renew{}
	return req, false, wire.Decode(typ, body, req)
}

// leave revokes the node that presented the certificate, at its request
// (stratum-agent leave): it is marked revoked as `nodes revoke` would,
// with the node as the event's actor, so its renewals are refused from
// now on.
func (l *Listener) leave(ctx context.Context, str Stream, nodeID, serial string) (wire.CloseCode, error) {
	t0 := time.Now()
	out, err := l.cluster.Leave(ctx, cluster.LeaveRequest{NodeID: nodeID, Serial: serial})
	l.metrics.storeOp("leave", t0, err)
	if err != nil {
		l.logger.Warn("record leave", "nodeId", nodeID, "err", err)
		return wire.CloseDone, errors.Join(err, wire.Write(str, l.unavailable(err)))
	}
	if out.Status != wire.StatusLeft {
		return wire.CloseDone, wire.Write(str, &wire.Result{Status: out.Status, Code: out.Code, Message: out.Message})
	}
	l.logger.Info("node left", "nodeId", nodeID, "remote", remoteAddr(ctx))
	return wire.CloseDone, wire.Write(str, &wire.Result{Status: wire.StatusLeft, NodeID: nodeID})
}
