package listener

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/big"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/stratumjoin/stratum/internal/cluster"
	"github.com/stratumjoin/stratum/internal/pake"
	"github.com/stratumjoin/stratum/internal/store"
	"github.com/stratumjoin/stratum/internal/wire"
	"github.com/stratumjoin/stratum/pki"
	"github.com/stratumjoin/stratum/pki/authority"
)

// Stream is what the join logic needs of a transport: QUIC in production,
// an in-memory pipe in unit tests.
type Stream interface {
	io.Reader
	io.Writer
	SetReadDeadline(time.Time) error
}

// Budgets for the agent's side of the exchange.
const (
	helloTimeout = 10 * time.Second
	// proofTimeout covers the agent's key stretching with the heaviest
	// parameters we accept.
	proofTimeout   = 60 * time.Second
	approvalPoll   = 250 * time.Millisecond
	approvalMaxAge = 24 * time.Hour
)

// Join runs one join exchange on str. exporter is the TLS exporter of the
// connection carrying it. It returns the QUIC application code to close
// the connection with.
func (l *Listener) Join(ctx context.Context, str Stream, exporter []byte) (closeCode wire.CloseCode, err error) {
	rep := l.startJoin(ctx)
	defer func() { rep.end(closeCode, err) }()
	str.SetReadDeadline(time.Now().Add(helloTimeout))
	var hello wire.Hello
	if err := l.fromPeer(func() error { return wire.Read(str, &hello) }); err != nil {
		return wire.CloseProtocol, fmt.Errorf("read hello: %w", err)
	}
	rep.phase("hello")

	// A code's unknown and inactive locators cost one durable write too
	// (see cluster.standIn), and no path of a token's or key's shape
	// writes (cluster.CountsBeforeKE2), so the Challenge's timing does not
	// tell the paths of one shape apart. The guess a KE1 asks lets a
	// repeated one resume its counted attempt. A code's start is charged
	// to its source's budget in the same write.
	ke1 := pake.ParseKE1(hello.KE1) // decoded once, for the guess and the KE2
	guess := ke1.Guess()
	t0 := time.Now()
	att, err := l.beginAttempt(ctx, cluster.BeginRequest{Locator: hello.Locator, Commit: hello.Attempt, Guess: guess, Budget: l.startBudget(ctx, hello.Locator)})
	l.metrics.storeOp("begin_attempt", t0, err)
	if err == nil && att.OverBudget { // nothing counted: not an attempt
		return wire.CloseDone, rep.write(str, l.overBudget(ctx, att))
	}
	rep.attempt(att)
	if errors.Is(err, cluster.ErrBusy) {
		return wire.CloseInternal, fmt.Errorf("count attempt: %w", err)
	}
	if err != nil {
		// The count's outcome is unknown: it counts as spent (a refund
		// may give it back), and no Challenge leaves. The agent is told
		// the store failed, which says nothing about the code.
		l.logger.Warn("count attempt", "err", err)
		return wire.CloseDone, errors.Join(fmt.Errorf("count attempt: %w", err), rep.write(str, l.unavailable(err)))
	}
	ctx = withCharge(ctx, att.Charge)

	l.mu.RLock()
	currentFP := l.caFP
	chains := l.chainsFP
	l.mu.RUnlock()
	var record []byte
	fp, ksf := currentFP, l.ksfFor(cluster.CountsBeforeKE2(hello.Locator))
	if att.Secret != nil {
		record, fp, ksf = att.Secret.Record, att.Secret.CAFingerprint, att.Secret.KSF
	}
	caChain, ok := chains[fp]
	if !ok { // minted under a root this key directory never had
		record, fp, caChain = nil, currentFP, chains[currentFP]
	}
	rootFP, err := pki.ParseFingerprint(fp)
	if err != nil {
		return wire.CloseInternal, fmt.Errorf("stored fingerprint: %w", err)
	}
	binding := wire.BindingContext(exporter)
	ke2, login, err := l.opaque.RespondKE1(binding, rootFP[:], hello.Locator, ke1, record)
	if err != nil {
		return wire.CloseProtocol, fmt.Errorf("respond: %w", err)
	}
	if h := l.cfg.hooks.Challenge; h != nil {
		h(hello.Locator, record != nil, att.Counted)
	}
	if err := wire.Write(str, &wire.Challenge{KE2: ke2, CAChain: caChain, KSF: ksf}); err != nil {
		return wire.CloseProtocol, err
	}
	rep.phase("challenge")

	str.SetReadDeadline(time.Now().Add(proofTimeout))
	var proof wire.Proof
	if err := l.fromPeer(func() error { return wire.Read(str, &proof) }); err != nil {
		// a wrong code (the agent refused the KE2) or a broken
		// connection: the attempt stays counted; a broken one stays
		// refundable to a proof that reveals its nonce
		refusedKE2 := agentRefusedKE2(err)
		if refusedKE2 {
			rep.failedProof(att)
		}
		l.endLease(att, !refusedKE2)
		return wire.CloseNotProof, fmt.Errorf("read proof: %w", err)
	}
	if h := l.cfg.hooks.Proof; h != nil {
		h(hello.Locator)
	}
	rep.phase("proof")
	if record == nil {
		rep.failedProof(att)
		return wire.CloseNotProof, pake.ErrNotAccepted
	}
	if err := login.Finish(proof.KE3); err != nil {
		rep.failedProof(att)
		l.abandon(att)
		return wire.CloseNotProof, err
	}
	str.SetReadDeadline(time.Time{})
	// A proven start gives its source's budget back: in the first Prove
	// that commits, or here on the way out if none does.
	defer l.refundProven(ctx)

	// Parsed and checked once here; the issuer signs for the same value.
	// Only the holder of the CSR's key may make, resume or replace a join
	// for that key: a pending join is found by the key's fingerprint, and
	// resuming it gives it this session's SAS.
	csr, err := authority.ParseCSR(proof.CSR)
	if errors.Is(err, authority.ErrCSRSignature) {
		l.abandon(att)
		return wire.CloseDone, wire.Write(str, &wire.Result{Status: wire.StatusRefused, Code: wire.CodeBadCSR, Message: "the certificate request is malformed or its signature does not verify"})
	}
	if err != nil {
		l.uncount(att) // proven: not a failed guess
		return wire.CloseDone, rep.write(str, &wire.Result{Status: wire.StatusRefused, Code: wire.CodeBadCSR, Message: "the certificate request is malformed or its signature does not verify"})
	}
	keyFP := sha256.Sum256(csr.RawSubjectPublicKeyInfo())
	req := cluster.ProveRequest{
		Attempt:    att,
		Refunds:    proof.Refunds,
		Facts:      proof.Facts,
		KeyFP:      hex.EncodeToString(keyFP[:]),
		CurrentCA:  currentFP,
		NewNodeID:  pki.NodeID,
		Issue:      l.issuer(csr),
		RequireTPM: l.poolRequiresTPM(att.Secret.Pool),
		Remote:     rep.remote,
		SAS: func(joinID string) string {
			sas, _ := login.SAS(joinID) // KE3 verified above
			return sas
		},
	}
	if proof.TPM != nil {
		if req.TPM, req.TPMRefusal, err = l.attest(str, proof.TPM, csr.PublicKey()); err != nil {
			l.abandon(att)
			return wire.CloseProtocol, fmt.Errorf("tpm attestation: %w", err)
		}
	}
	deadline := l.now().Add(approvalMaxAge) // Config.Now: tests move it
	// While pending, stop polling as soon as the agent is gone: it comes
	// back with the same key and continues the join on a new connection.
	waitCtx := ctx
	if sc, ok := str.(interface{ Context() context.Context }); ok {
		var cancel context.CancelFunc
		waitCtx, cancel = context.WithCancel(ctx)
		defer cancel()
		defer context.AfterFunc(sc.Context(), cancel)()
	}
	announced := false
	for {
		t0 := time.Now()
		req.Budget = budgetCharge(ctx)
		out, err := l.cluster.Prove(ctx, req)
		l.metrics.storeOp("prove", t0, err)
		if err == nil && req.Budget.Charged() {
			l.refundedByProve(ctx)
		}
		rep.phase("prove")
		if req.Attempt.Counted {
			l.leaseQueue.release(req.Attempt.Secret.ID) // proven or not, its lease is gone
		}
		if errors.Is(err, authority.ErrInvalidCSR) {
			l.uncount(req.Attempt)
			return wire.CloseDone, rep.write(str, &wire.Result{Status: wire.StatusRefused, Code: wire.CodeBadCSR, Message: "the certificate request is malformed or its signature does not verify"})
		}
		if err != nil {
			l.logger.Warn("record join", "err", err)
			return wire.CloseDone, errors.Join(err, rep.write(str, l.unavailable(err)))
		}
		if out.Status != wire.StatusPending {
			return wire.CloseDone, rep.write(str, l.result(out))
		}
		// Announce once per connection, a resumed join too (its attempt
		// may not have been counted: a code whose last use it holds is no
		// longer live); later rounds only poll.
		if !announced {
			pendingFor := int64(deadline.Sub(l.now()) / time.Second)
			if err := wire.Write(str, &wire.Result{Status: wire.StatusPending, JoinID: out.Join.ID, SAS: out.Join.SAS, PendingFor: pendingFor, Message: "waiting for an administrator to approve join " + out.Join.ID}); err != nil {
				return wire.CloseProtocol, err
			}
			announced = true
		}
		req.Attempt.Counted = false
		l.metrics.pending.Inc()
		l.awaitApproval(true)
		err = l.waitDecision(waitCtx, out.Join.ID, deadline)
		l.awaitApproval(false)
		l.metrics.pending.Dec()
		if errors.Is(err, errStoreWait) {
			l.logger.Warn("wait for approval", "joinId", out.Join.ID, "err", err)
			return wire.CloseDone, errors.Join(err, rep.write(str, l.unavailable(err)))
		} else if err != nil {
			rep.outcome = outcomePending
			return wire.CloseDone, err
		}
	}
}

var (
	errStoreWait        = errors.New("read the pending join")
	errApprovalTimedOut = errors.New("approval timed out")
)

// unavailable is the retryable refusal an agent reads when a store call
// failed; its message names the failure, and never the code.
func (l *Listener) unavailable(err error) *wire.Result {
	msg := "the listener cannot reach its store"
	switch {
	case errors.Is(err, store.ErrNoSpace):
		msg = "the listener's store is out of disk space until an operator makes room"
	case errors.Is(err, store.ErrCorrupt):
		msg = "the listener's store is damaged; an operator must restore it from a backup"
	}
	retry := int64(l.cfg.StoreTimeout.Seconds() + 0.999)
	if retry < 1 {
		retry = 1
	}
	return &wire.Result{Status: wire.StatusRefused, Code: wire.CodeUnavailable, Message: msg, RetryAfter: retry}
}

// waitDecision waits until a pending join is decided or its deadline
// passes. Where the store can watch, the join's record is read again only
// when it changes: a fleet waiting for its administrator costs no store
// reads, and a decision ends the wait at once. Without a watch (or while
// a broken one cannot be renewed) the record is read every approvalPoll.
func (l *Listener) waitDecision(ctx context.Context, joinID string, deadline time.Time) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the watch
	expiry := time.NewTimer(deadline.Sub(l.now()))
	defer expiry.Stop()
	var changed <-chan struct{}
	for {
		if changed == nil {
			// watched before the read, so a decision after it wakes us
			var err error
			if changed, err = l.cluster.WatchJoin(ctx, joinID); err != nil {
				l.logger.Debug("watch pending join, polling instead", "joinId", joinID, "err", err)
			}
		}
		j, err := l.cluster.Join(ctx, joinID)
		if ctx.Err() != nil {
			return ctx.Err() // the agent left, or the listener is stopping
		}
		if err != nil {
			// not swallowed: the agent is told the store is unreachable
			// and comes back to the same pending join
			return fmt.Errorf("%w: %w", errStoreWait, err)
		}
		if !j.IsPending() {
			return nil
		}
		var poll <-chan time.Time
		if changed == nil {
			poll = time.After(approvalPoll)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-expiry.C:
			return errApprovalTimedOut
		case <-poll:
		case _, open := <-changed:
			if !open {
				changed = nil // broken: read again and watch anew
			}
		}
		if l.now().After(deadline) {
			return errApprovalTimedOut
		}
	}
}

// issuer signs node certificates for a request that authority.ParseCSR
// checked.
func (l *Listener) issuer(csr *authority.CSR) cluster.Issuer {
	return func(nodeID, role string) (cluster.Cert, error) {
		l.mu.RLock()
		ca := l.ca
		l.mu.RUnlock()
		cert, err := ca.IssueNodeCert(authority.NodeRequest{Parsed: csr, NodeID: nodeID, TrustDomain: l.settings.TrustDomain, Role: role, Lifetime: time.Duration(l.settings.NodeLifetime), Now: l.now()})
		if err != nil {
			return cluster.Cert{}, err
		}
		return cluster.Cert{DER: cert.Raw, Serial: serialHex(cert.SerialNumber), NotBefore: cert.NotBefore, NotAfter: cert.NotAfter}, nil
	}
}

func serialHex(n *big.Int) string { return hex.EncodeToString(n.Bytes()) }

// result turns an outcome into the Result frame.
func (l *Listener) result(out cluster.Outcome) *wire.Result {
	if out.Status != wire.StatusJoined {
		r := &wire.Result{Status: out.Status, Code: out.Code, Message: out.Message}
		if out.Join != nil {
			r.JoinID = out.Join.ID
		}
		return r
	}
	l.mu.RLock()
	chain := append([][]byte{out.Cert.DER}, certsDER(l.ca.Intermediates())...)
	bundle := certsDER(l.roots)
	l.mu.RUnlock()
	life := out.Cert.NotAfter.Sub(out.Cert.NotBefore)
	r := &wire.Result{
		Status:     wire.StatusJoined,
		NodeID:     out.Node.ID,
		CertChain:  chain,
		CABundle:   bundle,
		Role:       out.Node.Role,
		Trust:      out.Node.Trust,
		RenewAfter: out.Cert.NotBefore.Add(life * 2 / 3).Unix(),
		Host:       out.Node.Host.Wire(),
	}
	if out.Join != nil {
		r.JoinID = out.Join.ID
	}
	return r
}

// beginAttempt counts the attempt, waiting while the secret's attempts
// are all in flight (ErrBusy) so that holders proving the right code at
// once are not taken for a guessing storm. Waiters queue per secret and
// are woken one at a time as leases end here; a slow timer covers leases
// that end on another listener or expire. A start whose source is over
// its budget waits up to BudgetWait for a refund (an honest start proving
// its code) and is then returned OverBudget.
func (l *Listener) beginAttempt(ctx context.Context, req cluster.BeginRequest) (cluster.Attempt, error) {
	ctx, cancel := context.WithTimeout(ctx, cluster.LeaseTime)
	defer cancel()
	var budgetWait <-chan time.Time // from the first answer over budget
	for {
		var refunded <-chan struct{}
		if req.Budget != nil {
			refunded = l.refundSignal() // before Begin reads the budget
		}
		att, err := l.cluster.Begin(ctx, req)
		if err == nil && att.OverBudget {
			if budgetWait == nil {
				t := time.NewTimer(l.cfg.BudgetWait)
				defer t.Stop()
				budgetWait = t.C
			}
			// refunds on other listeners sharing the store are seen by
			// the poll
			poll := time.NewTimer(time.Second)
			select {
			case <-ctx.Done():
				poll.Stop()
				return cluster.Attempt{}, ctx.Err()
			case <-budgetWait:
				poll.Stop()
				return att, nil
			case <-refunded:
			case <-poll.C:
			}
			poll.Stop()
			continue
		}
		if !errors.Is(err, cluster.ErrBusy) {
			return att, err
		}
		woken := l.leaseQueue.wait(att.Secret.ID)
		// the timer only covers leases that end on another listener or
		// expire; with thousands waiting, a short one would be a busy loop
		t := time.NewTimer(time.Duration(2000+rand.IntN(3000)) * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			l.leaseQueue.leave(att.Secret.ID, woken)
			return att, err
		case <-woken:
		case <-t.C:
		}
		t.Stop()
	}
}

// leaseQueue wakes starts waiting for a secret's in-flight attempts.
type leaseQueue struct {
	mu      sync.Mutex
	waiting map[string][]chan struct{}
}

func (q *leaseQueue) wait(secretID string) <-chan struct{} {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.waiting == nil {
		q.waiting = map[string][]chan struct{}{}
	}
	ch := make(chan struct{})
	q.waiting[secretID] = append(q.waiting[secretID], ch)
	return ch
}

// leave takes a start that gave up out of the queue; if it had been woken
// already, the wake-up goes to the next in line.
func (q *leaseQueue) leave(secretID string, ch <-chan struct{}) {
	q.mu.Lock()
	w := q.waiting[secretID]
	for i, c := range w {
		if c == ch {
			q.waiting[secretID] = append(w[:i:i], w[i+1:]...)
			q.mu.Unlock()
			return
		}
	}
	q.mu.Unlock()
	select {
	case <-ch:
		q.release(secretID)
	default:
	}
}

// release wakes the longest waiting start for secretID, if any.
func (q *leaseQueue) release(secretID string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	w := q.waiting[secretID]
	if len(w) == 0 {
		return
	}
	close(w[0])
	if len(w) == 1 {
		delete(q.waiting, secretID)
	} else {
		q.waiting[secretID] = w[1:]
	}
}

// uncount takes back a proven attempt that ends without Prove committing.
func (l *Listener) uncount(att cluster.Attempt) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := l.cluster.Uncount(ctx, att); err != nil {
		l.logger.Warn("take back proven attempt", "err", err)
	}
	if att.Counted {
		l.leaseQueue.release(att.Secret.ID)
	}
}

// abandon frees a failed attempt's lease; it stays counted.
func (l *Listener) abandon(att cluster.Attempt) { l.endLease(att, false) }

// endLease frees a lease; orphan keeps the attempt refundable.
func (l *Listener) endLease(att cluster.Attempt, orphan bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	end := l.cluster.Abandon
	if orphan {
		end = l.cluster.Orphan
	}
	if err := end(ctx, att); err != nil {
		l.logger.Warn("free attempt lease", "err", err)
	}
	if att.Counted {
		l.leaseQueue.release(att.Secret.ID)
	}
}
