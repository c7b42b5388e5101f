package cluster

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/stratumjoin/stratum/internal/joincode"
	"github.com/stratumjoin/stratum/internal/pake"
	"github.com/stratumjoin/stratum/internal/wire"
)

// Attempt is one started exchange: the secret's record to answer KE1 with,
// and whether the start was counted as unproven.
type Attempt struct {
	Secret  *Secret // nil for an unknown locator
	Counted bool
	LeaseID string
	Commit  string // the lease's commitment, "" when none was recorded
	// Resumed: the start repeated the guess of an attempt counted before
	// (a crash cut it short), and took its place instead of counting.
	Resumed bool
	Guess   string
	// Burned: this start took the secret past MaxUnproven and burned it.
	Burned bool
	// Deferred: a token's or key's start, which nothing burns, so nothing
	// was written before its KE2; it is counted when it ends unproven
	// (Abandon, Orphan) and costs nothing when it proves.
	Deferred bool
	// Charge is the start's charge to its source's budget, made in the
	// transaction that counted it (BeginRequest.Budget); Prove or Refund
	// gives it back once the start is proven.
	Charge Charge
	// OverBudget: the source had spent its budget (BeginRequest.Budget),
	// so nothing was counted, charged or looked up; a slot frees in
	// RetryAfter.
	OverBudget bool
	RetryAfter time.Duration
}

// CountsBeforeKE2 reports whether a start naming locator is counted, and so
// written, before its KE2 leaves: a join code's (its 11th unproven start
// burns it) and any locator of no secret's shape. A token's or key's start
// is not: nothing burns them, and an uncounted KE2 is a free guess only at
// a secret nobody can guess. The answer depends on the locator's shape
// alone, never on whether a secret has it, so the paths of one shape (live,
// inactive, unknown) cost the same.
func CountsBeforeKE2(locator string) bool {
	k := joincode.LocatorKind(locator)
	return k != joincode.KindToken && k != joincode.KindKey
}

// LeaseTime bounds how long a counted attempt may stay in flight before
// it is taken as failed; the listener waits no longer for a Proof.
const LeaseTime = 90 * time.Second

// ErrBusy means the secret already has MaxUnproven attempts counted and
// some are still in flight: the start must wait for them rather than burn
// a code that its holders may be proving right now. The Attempt returned
// with it names the secret, so the caller can wait for that one.
var ErrBusy = errors.New("too many attempts in flight for this secret")

// BeginAttempt looks up a locator and, for a live secret, counts one
// unproven attempt in a single durable transaction before KE2 may leave.
// The start that would take the count past MaxUnproven burns the secret
// instead. An inactive secret is returned uncounted, so only the holder of
// the right code learns why it is refused. An error means the count's
// outcome is unknown: the caller must not answer.
func (c *Cluster) BeginAttempt(ctx context.Context, locator string) (Attempt, error) {
	return c.Begin(ctx, BeginRequest{Locator: locator})
}

// BeginRequest starts an attempt.
type BeginRequest struct {
	Locator string
	// Commit is the agent's commitment (Hello field Attempt): the lease
	// records it, so the attempt can be refunded to a proof that reveals
	// the nonce. One of the wrong size, or one the secret already holds,
	// is not recorded; the attempt counts all the same.
	Commit []byte
	// Guess names the password guess of the KE1 (pake.GuessOf). A start
	// whose guess is that of a counted attempt still unproven resumes it
	// and counts nothing: it asks the same question again.
	Guess string
	// Budget, when set, charges a counted start to its source's budget
	// in the transaction that counts it: one durable write for both. A
	// source over its budget is answered (Attempt.OverBudget) before the
	// locator is looked up or locked, so the answer is the same whether
	// or not a secret has it. Starts that are not counted before the KE2
	// (CountsBeforeKE2) are not charged.
	Budget *StartBudget
}

// Begin is BeginAttempt with the agent's commitment and guess.
func (c *Cluster) Begin(ctx context.Context, req BeginRequest) (Attempt, error) {
	if !CountsBeforeKE2(req.Locator) {
		req.Budget = nil
		return c.beginDeferred(ctx, req)
	}
	return c.beginCounted(ctx, req)
}

// beginCounted counts a start in one durable transaction (see Begin).
func (c *Cluster) beginCounted(ctx context.Context, req BeginRequest) (Attempt, error) {
	locator, commit := req.Locator, req.Commit
	if req.Budget != nil {
		// a source over budget is answered before its locator is
		// locked or read; the transaction below checks again
		over, after, err := c.overBudget(ctx, *req.Budget)
		if err != nil {
			return Attempt{}, fmt.Errorf("count attempt: %w", err)
		}
		if over {
			return Attempt{OverBudget: true, RetryAfter: after}, nil
		}
	}
	ctx, unlock := c.locks.lock(ctx, locator)
	defer unlock()
	var att Attempt
	err := c.update(ctx, func(tx *txn) error {
		att = Attempt{}
		if req.Budget != nil {
			ch, ok, after, err := chargeIn(tx, c.now().UnixNano(), *req.Budget, true)
			if err != nil {
				return err
			}
			if !ok {
				att.OverBudget, att.RetryAfter = true, after
				return nil
			}
			att.Charge = ch
		}
		s, err := secretByLocator(tx, locator)
		if err != nil {
			return err
		}
		now := c.now().UTC()
		if s == nil {
			// read as much as the live path does, then write as it does
			if _, err := tx.get(secretKey("-")); err != nil {
				return err
			}
			c.standIn(tx, now, nil)
			return nil
		}
		att.Secret = s
		if !s.Live(now) {
			c.standIn(tx, now, s)
			return nil
		}
		s.liveLeases(now)
		if req.Guess != "" {
			if l, ok := s.resume(req.Guess, now); ok {
				att.Counted, att.LeaseID, att.Commit, att.Guess, att.Resumed = true, l.ID, l.Commit, l.Guess, true
				tx.put(secretKey(s.ID), s)
				return nil
			}
		}
		if s.Burns() && s.Unproven+1 > MaxUnproven && len(s.Leases) > 0 {
			return ErrBusy
		}
		if s.Burns() && s.Unproven+1 > MaxUnproven {
			// Nothing revives a burned code, so the commitments its
			// orphans keep for refunds are dead weight, and they made
			// every later start on it read and write a record twice the
			// size of a live one: measurably slower (BenchmarkChallengeTiming,
			// KS distance 0.07-0.08 against the other kinds at 1,000 each).
			s.Leases, s.Orphans = nil, nil
			s.RevokedAt, s.RevokedBy, s.ModifiedAt = &now, BurnedBy, now
			tx.event(EventSecretBurned, SystemActor, map[string]any{"id": s.ID, "kind": s.Kind, "failedAttempts": s.Unproven})
			att.Burned = true
		} else {
			s.Unproven++
			if !s.Burns() && len(s.Leases) >= maxTrackedLeases {
				// a token or key under a storm: nothing waits on its
				// leases, so keep the record small
				s.Leases = s.Leases[1:]
			}
			att.Counted, att.LeaseID = true, randomID("", 8)
			l := Lease{ID: att.LeaseID, Until: now.Add(LeaseTime), Guess: req.Guess}
			if len(commit) == sha256.Size {
				if h := hex.EncodeToString(commit); !s.knownCommit(h) {
					l.Commit = h
				}
			}
			s.Leases = append(s.Leases, l)
			att.Commit, att.Guess = l.Commit, l.Guess
		}
		tx.put(secretKey(s.ID), s)
		return nil
	})
	if errors.Is(err, ErrBusy) {
		att.Charge = Charge{} // rolled back with the count
		return att, err
	}
	if err != nil {
		return Attempt{}, fmt.Errorf("count attempt: %w", err)
	}
	return att, nil
}

// beginDeferred starts a token's or key's attempt: it reads what the
// counting path reads and writes nothing. Live, inactive and unknown
// locators of these shapes all take it. A secret of a shape that burns
// (none is minted so) is counted as a code's start would be.
func (c *Cluster) beginDeferred(ctx context.Context, req BeginRequest) (Attempt, error) {
	var att Attempt
	err := c.update(ctx, func(tx *txn) error {
		att = Attempt{}
		s, err := secretByLocator(tx, req.Locator)
		if err != nil {
			return err
		}
		if s == nil {
			// read and decode as much as the found path does
			if _, err := tx.get(secretKey("-")); err != nil {
				return err
			}
			var shape Secret
			return json.Unmarshal(standInFor(req.Locator), &shape)
		}
		att.Secret = s
		// an inactive secret's start is not counted, as for a code
		att.Deferred = !s.Burns() && s.Live(c.now().UTC())
		if len(req.Commit) == sha256.Size {
			att.Commit = hex.EncodeToString(req.Commit)
		}
		return nil
	})
	if err != nil {
		return Attempt{}, fmt.Errorf("look up attempt: %w", err)
	}
	if att.Secret != nil && att.Secret.Burns() {
		req.Locator = att.Secret.Locator
		return c.beginCounted(ctx, req)
	}
	return att, nil
}

// Abandon ends a counted attempt that will never be proven (wrong code,
// timeout, broken connection): it stays counted, and its lease is freed
// so waiting starts can go on. Without this call the lease expires.
func (c *Cluster) Abandon(ctx context.Context, att Attempt) error {
	return c.endLease(ctx, att, false)
}

// Orphan ends a counted attempt whose proof never came (the connection
// broke after the Challenge): it stays counted, and its commitment, if it
// had one, stays refundable.
func (c *Cluster) Orphan(ctx context.Context, att Attempt) error {
	return c.endLease(ctx, att, true)
}

func (c *Cluster) endLease(ctx context.Context, att Attempt, orphan bool) error {
	if att.Deferred {
		return c.countDeferred(ctx, att, orphan)
	}
	if !att.Counted || att.LeaseID == "" {
		return nil
	}
	return c.updateSecret(ctx, att, func(tx *txn, s *Secret) bool {
		before := len(s.Leases)
		s.dropLease(att.LeaseID, orphan)
		if len(s.Leases) == before {
			return false
		}
		c.failedEvent(tx, s)
		return true
	})
}

// updateSecret runs change on the record of att's secret under its
// locator's lock, and writes the record back when change reports it
// changed; a secret deleted meanwhile is left alone.
func (c *Cluster) updateSecret(ctx context.Context, att Attempt, change func(tx *txn, s *Secret) bool) error {
	ctx, unlock := c.locks.lock(ctx, att.Secret.Locator)
	defer unlock()
	return c.update(ctx, func(tx *txn) error {
		var s Secret
		found, err := tx.getJSON(secretKey(att.Secret.ID), &s)
		if err != nil || !found {
			return err
		}
		if change(tx, &s) {
			tx.put(secretKey(s.ID), s)
		}
		return nil
	})
}

// countDeferred counts a token's or key's start that ended unproven, after
// its answer: a failed proof, or (orphan) a connection that broke after the
// Challenge, whose commitment stays refundable to a later proof revealing
// its nonce, as a counted attempt's would.
func (c *Cluster) countDeferred(ctx context.Context, att Attempt, orphan bool) error {
	if att.Secret == nil {
		return nil
	}
	return c.updateSecret(ctx, att, func(tx *txn, s *Secret) bool {
		s.Unproven++
		if orphan && att.Commit != "" && !s.knownCommit(att.Commit) {
			s.Orphans = append(s.Orphans, Orphan{Commit: att.Commit})
			if len(s.Orphans) > maxTrackedLeases {
				s.Orphans = s.Orphans[len(s.Orphans)-maxTrackedLeases:]
			}
		}
		c.failedEvent(tx, s)
		return true
	})
}

// maxTrackedLeases bounds the in-flight attempts a token or key record
// keeps; codes are bounded by MaxUnproven already.
const maxTrackedLeases = 64

// failedEvent announces a token's or key's failed proofs when their count
// reaches the next power of two (1, 2, 4, 8, ...): operators see every
// storm, and a storm of n guesses writes log2(n) events, not n.
func (c *Cluster) failedEvent(tx *txn, s *Secret) {
	if s.Burns() {
		return
	}
	failed := s.Unproven - len(s.Leases)
	if failed <= s.FailedReported || failed&(failed-1) != 0 {
		return
	}
	s.FailedReported = failed
	typ := EventTokenFailed
	if s.Kind == KindKey {
		typ = EventKeyFailed
	}
	tx.event(typ, SystemActor, map[string]any{"id": s.ID, "kind": s.Kind, "failedAttempts": failed})
}

// standIn makes the paths that count nothing (an unknown locator, an
// inactive secret) cost what counting costs: one durable transaction of
// the same shape. Sleeping for an estimate could not reproduce the
// distribution of fsync times; a real write does. And the write is as
// large as the live path's, built the same way: the live path decodes the
// secret, adds a lease and encodes it again, so the stand-in decodes a
// secret (the inactive one, or a template of the usual size for an
// unknown locator), adds a lease and encodes it. A stand-in that wrote
// only a time stamp was measurably faster (BenchmarkChallengeTiming: KS
// distance 0.08 to 0.10 against live at 1,000 samples each). The key also
// records when the last unmatched attempt happened, which operators can
// watch.
func (c *Cluster) standIn(tx *txn, now time.Time, s *Secret) {
	var shape Secret
	if s != nil {
		shape = *s
	} else if err := json.Unmarshal(standInFor(""), &shape); err != nil {
		panic(fmt.Sprintf("cluster: stand-in template: %v", err)) // our own constant
	}
	shape.ModifiedAt = now
	shape.Leases = append(slices.Clone(shape.Leases), Lease{ID: "stand-in", Until: now.Add(LeaseTime)})
	tx.put(keyUnmatched, unmatchedAttempt{At: now, Shape: &shape})
}

// unmatchedAttempt is the stand-in record: when, and a secret-sized shape.
type unmatchedAttempt struct {
	At    time.Time `json:"at"`
	Shape *Secret   `json:"shape"`
}

// standInFor is the record an unknown locator's start decodes in place
// of a secret's: one of its shape's family, of the usual size, so the
// unknown path of each family reads as much as its found path does. An
// unknown code's stand-in also writes its template (standIn); tokens' and
// keys' starts write nothing.
func standInFor(locator string) []byte {
	switch joincode.LocatorKind(locator) {
	case joincode.KindToken:
		return standInToken
	case joincode.KindKey:
		return standInKey
	}
	return standInCode
}

var (
	standInAt       = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	standInExpires  = standInAt.Add(time.Hour)
	standInCAFP     = strings.Repeat("00:", 31) + "00"
	standInEndpoint = "stand-in.invalid:9444"

	// a join code as `codes create` mints it
	standInCode = mustJSON(Secret{
		ID: "jc-00000000", Kind: KindCode, Locator: "00", Record: make([]byte, pake.RecordSize),
		KSF: pake.CodeKSF, CAFingerprint: standInCAFP, Endpoint: standInEndpoint,
		Endpoints: []string{standInEndpoint}, Tenant: "default", Pool: "default", Role: RoleNode,
		Trust: TrustPlatform, RequireApproval: true, CreatedBy: "uid:0", CreatedAt: standInAt, ModifiedAt: standInAt, ExpiresAt: &standInExpires,
	})
	// a token as the joinTokens API mints it: its id is jt_ and the 52
	// symbols of a SHA-256, and its listing index names it
	standInTokenID = "jt_" + strings.Repeat("0", 52)
	standInToken   = mustJSON(Secret{
		ID: standInTokenID, Kind: KindToken, Locator: standInTokenID, Record: make([]byte, pake.RecordSize),
		CAFingerprint: standInCAFP, Endpoint: standInEndpoint, Tenant: "default", Pool: "default", Role: RoleNode,
		Trust: TrustPlatform, MaxUses: 1, CreatedBy: "uid:0", CreatedAt: standInAt, ModifiedAt: standInAt, ExpiresAt: &standInExpires,
		Index: []string{tokenIndexPrefix("default", "default") + standInTokenID},
	})
	// a join key as the join keys API mints it
	standInKeyID = "dnjoin-" + strings.Repeat("A", 26)
	standInKey   = mustJSON(Secret{
		ID: standInKeyID, Kind: KindKey, Locator: standInKeyID, Record: make([]byte, pake.RecordSize),
		CAFingerprint: standInCAFP, Endpoint: standInEndpoint, Tenant: "org-00000000", Pool: "network/net-00000000",
		Role: RoleNodeTenant, Trust: TrustTenantOwned, CreatedBy: "apikey:00000000", CreatedAt: standInAt, ModifiedAt: standInAt,
		Key:   &KeyAttrs{Name: "stand-in", OrgID: "org-00000000", NetworkID: "net-00000000", Tags: []string{"stand-in"}, CIDRs: []string{"10.0.0.0/16"}},
		Index: []string{keyIndexPrefix("org-00000000") + standInKeyID},
	})
)

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// Issuer signs a node certificate for nodeID with role; it is called
// inside the transaction loop and its output only leaves once the
// transaction committed.
type Issuer func(nodeID, role string) (Cert, error)

// Cert is an issued node certificate.
type Cert struct {
	DER       []byte
	Serial    string
	NotBefore time.Time
	NotAfter  time.Time
}

// ProveRequest completes a join whose KE3 verified.
type ProveRequest struct {
	Attempt Attempt
	// Refunds are the nonces of this agent's earlier attempts with the
	// code that were never proven (Proof field Refunds).
	Refunds   [][]byte
	Facts     wire.Facts
	KeyFP     string // SHA-256 of the CSR's public key
	CurrentCA string // fingerprint of the current root
	NewNodeID func() (string, error)
	Issue     Issuer
	// SAS derives the short authentication string of this PAKE session
	// for a join id; nil leaves joins without one.
	SAS func(joinID string) string
	// Remote is the agent's address, recorded in the node.joined event.
	Remote string
	// TPM is the verified attestation of the key, nil when the agent
	// offered none; RequireTPM says the secret's pool demands one.
	TPM        *TPMVerdict
	RequireTPM bool
	// TPMRefusal, when set, is why the agent's attestation was refused:
	// the join is refused with JOIN_TPM_REQUIRED in the transaction, so
	// the attempt is un-counted and no use is spent.
	TPMRefusal string
	// Budget is the start's charge to its source's budget of unproven
	// starts: the start is proven, so the transaction that records its
	// join gives the charge back too, rather than a commit of its own.
	Budget Charge
}

// Outcome is what a proven join leads to.
type Outcome struct {
	Status  string // wire.StatusJoined, StatusPending or StatusRefused
	Code    string
	Message string
	Join    *Join
	Node    *Node
	Cert    Cert
	Secret  *Secret
}

func refused(code, msg string) Outcome {
	return Outcome{Status: wire.StatusRefused, Code: code, Message: msg}
}

// Prove applies a proven join in one transaction: un-count the attempt,
// re-check the secret, check `expect`, then resume this key's earlier join
// or consume a use and create the node (or a pending join).
func (c *Cluster) Prove(ctx context.Context, req ProveRequest) (Outcome, error) {
	if req.Attempt.Secret == nil {
		return Outcome{}, errors.New("prove without a secret")
	}
	id := req.Attempt.Secret.ID
	ctx, unlock := c.locks.lock(ctx, req.Attempt.Secret.Locator)
	defer unlock()
	if req.NewNodeID != nil {
		req.NewNodeID = onceNodeID(req.NewNodeID)
	}
	req.Issue = memoIssue(req.Issue)
	var out Outcome
	err := c.update(ctx, func(tx *txn) error {
		if err := refundIn(tx, req.Budget); err != nil {
			return err
		}
		var s Secret
		found, err := tx.getJSON(secretKey(id), &s)
		if err != nil {
			return err
		}
		if !found {
			out = refused(wire.CodeRevoked, "the join code was deleted")
			return nil
		}
		now := c.now().UTC()
		if req.Attempt.Counted && s.Unproven > 0 && s.proven(req.Attempt) {
			s.Unproven--
		}
		s.liveLeases(now)
		if n := s.refund(req.Refunds); n > 0 {
			tx.event(EventAttemptsRefunded, SystemActor, map[string]any{"id": s.ID, "refunded": n, "failedAttempts": s.Unproven})
		}
		if out, err = c.prove(tx, &s, req, now); err != nil {
			return err
		}
		s.ModifiedAt = now
		tx.put(secretKey(id), s)
		out.Secret = &s
		return nil
	})
	if err != nil {
		return Outcome{}, fmt.Errorf("commit join: %w", err)
	}
	return out, nil
}

func (c *Cluster) refuse(tx *txn, s *Secret, code, msg string, fields map[string]any) Outcome {
	if fields == nil {
		fields = map[string]any{}
	}
	fields["secretId"], fields["code"] = s.ID, code
	tx.event(EventJoinRefused, SystemActor, fields)
	return refused(code, msg)
}

func (c *Cluster) prove(tx *txn, s *Secret, req ProveRequest, now time.Time) (Outcome, error) {
	switch st := s.State(now); {
	case st == stateRevoked && s.Burned():
		return c.refuse(tx, s, wire.CodeRevoked, "the "+kindName(s.Kind)+" was burned after too many failed attempts; ask for a new one", nil), nil
	case st == stateRevoked && s.RevokedBy == UsedUpBy:
		// used up: the joins it holds go on; a new one is refused below
	case st == stateRevoked && s.RevokedBy == CARotatedBy:
		return c.refuse(tx, s, wire.CodeStale, "the join code was minted under a cluster CA that has since been rotated; ask for a new one", nil), nil
	case st == stateRevoked && s.RevokedBy == CARetiredBy:
		return c.refuse(tx, s, wire.CodeRevoked, "the "+kindName(s.Kind)+" was minted under a cluster CA root that has been retired; ask for a new one", nil), nil
	case st == stateRevoked:
		return c.refuse(tx, s, wire.CodeRevoked, "the "+kindName(s.Kind)+" was revoked; ask for a new one", nil), nil
	}
	// A code's record commits to its root, and a rotation ends it; a token
	// or key goes on joining through its root until that root is retired
	// (it then is revoked, above), and its agent pins the current root.
	if s.Burns() && s.CAFingerprint != req.CurrentCA {
		return c.refuse(tx, s, wire.CodeStale, "the join code was minted under a cluster CA that has since been rotated; ask for a new one", nil), nil
	}
	if req.TPMRefusal != "" {
		return c.refuse(tx, s, wire.CodeTPMRequired, req.TPMRefusal, nil), nil
	}
	if req.RequireTPM && req.TPM == nil {
		return c.refuse(tx, s, wire.CodeTPMRequired, "this pool requires TPM attestation, and this agent offered none (run it on a machine with a TPM, or give it --tpm)", nil), nil
	}
	if MismatchedTPM(s.Expect, req.TPM) {
		return c.refuse(tx, s, wire.CodeIdentityMismatch, "this machine's TPM is not the one the join code is pinned to (ekHash)", map[string]any{"field": FieldEKHash}), nil
	}
	if field := MismatchedField(s.Expect, req.Facts); field != "" {
		return c.refuse(tx, s, wire.CodeIdentityMismatch, "this machine's "+field+" is not the one the "+kindName(s.Kind)+" is pinned to", map[string]any{"field": field}), nil
	}

	// A join this key already made with this secret is continued, never
	// charged a second use.
	jkKey := joinIndexKey(s.ID, req.KeyFP)
	joinID, joined, err := tx.getString(jkKey)
	if err != nil {
		return Outcome{}, err
	}
	if joined {
		var j Join
		found, err := tx.getJSON(joinKey(joinID), &j)
		if err != nil {
			return Outcome{}, err
		}
		if !found {
			return Outcome{}, fmt.Errorf("join %s indexed but missing", joinID)
		}
		return c.resume(tx, s, &j, req, now)
	}

	// Expiry ends new joins only: a join proven while the code was live
	// (pending an administrator, or whose Result was lost) goes on after
	// it, as the approval may come hours later.
	if s.State(now) == stateExpired {
		return c.refuse(tx, s, wire.CodeExpired, "the "+kindName(s.Kind)+" expired; ask for a new one", nil), nil
	}
	if s.usedUp() {
		return c.refuse(tx, s, wire.CodeUsedUp, "the "+kindName(s.Kind)+" has no uses left; ask for a new one", nil), nil
	}
	j := &Join{ID: randomID("join-", 10), SecretID: s.ID, KeyFP: req.KeyFP, Facts: factsFrom(req.Facts), Pool: s.Pool, CreatedAt: now}
	if s.RequireApproval {
		j.State = joinPending
		if req.SAS != nil {
			j.SAS = req.SAS(j.ID)
		}
		s.Uses++
		c.revokeIfUsedUp(tx, s, now)
		tx.put(joinKey(j.ID), j)
		tx.putString(jkKey, j.ID)
		tx.event(EventJoinPending, SystemActor, map[string]any{"joinId": j.ID, "secretId": s.ID, "keyFingerprint": req.KeyFP})
		return Outcome{Status: wire.StatusPending, Join: j}, nil
	}
	out, err := c.completeNode(tx, s, j, req, now)
	if err != nil || out.Status != wire.StatusJoined {
		return out, err
	}
	s.Uses++
	c.revokeIfUsedUp(tx, s, now)
	tx.putString(jkKey, j.ID)
	return out, nil
}

// revokeIfUsedUp revokes a join code by UsedUpBy the moment its last
// allowed use is spent, with an event. Tokens keep their used-up state
// (the joinTokens API lists them as used up, not revoked).
func (c *Cluster) revokeIfUsedUp(tx *txn, s *Secret, now time.Time) {
	if s.Kind != KindCode || s.MaxUses == 0 || s.Uses < s.MaxUses || s.RevokedAt != nil {
		return
	}
	s.RevokedAt, s.RevokedBy = &now, UsedUpBy
	tx.event(EventCodeRevoked, UsedUpBy, map[string]any{"id": s.ID, "pool": s.Pool, "tenant": s.Tenant, "uses": s.Uses})
}

// kindName names a secret's kind in messages agents print.
func kindName(kind string) string {
	switch kind {
	case KindToken:
		return "join token"
	case KindKey:
		return "join key"
	}
	return "join code"
}

func (c *Cluster) resume(tx *txn, s *Secret, j *Join, req ProveRequest, now time.Time) (Outcome, error) {
	switch j.State {
	case joinPending:
		// The holder of the CSR's key came back on a new PAKE session
		// (the listener checked the CSR's signature): the SAS is now that
		// session's, the one its agent prints.
		if req.SAS != nil {
			if sas := req.SAS(j.ID); sas != j.SAS {
				j.SAS = sas
				tx.put(joinKey(j.ID), j)
			}
		}
		return Outcome{Status: wire.StatusPending, Join: j}, nil
	case joinRefused:
		return refused(wire.CodeApprovalRefused, "an administrator refused this join"), nil
	case joinApproved:
		// The node gets the facts the administrator approved, not what
		// the reconnecting agent claims now.
		req.Facts = j.Facts.Wire()
		return c.completeNode(tx, s, j, req, now)
	}
	// completed: the Result was lost; hand out a fresh certificate for the
	// same node if it still stands.
	var n Node
	found, err := tx.getJSON(nodeKey(j.NodeID), &n)
	if err != nil {
		return Outcome{}, err
	}
	if !found || !n.Active() || n.KeyFP != req.KeyFP {
		return c.refuse(tx, s, wire.CodeNodeRevoked, "the node this key joined as was revoked or replaced", nil), nil
	}
	cert, err := req.Issue(n.ID, n.Role)
	if err != nil {
		return Outcome{}, err
	}
	n.CertSerial, n.NotAfter = cert.Serial, cert.NotAfter
	tx.put(nodeKey(n.ID), n)
	tx.putString(serialKey(cert.Serial), serialOwner(&n))
	return Outcome{Status: wire.StatusJoined, Join: j, Node: &n, Cert: cert}, nil
}

// completeNode creates (or reclaims) the node for a join and issues its
// certificate; the caller has charged the use.
func (c *Cluster) completeNode(tx *txn, s *Secret, j *Join, req ProveRequest, now time.Time) (Outcome, error) {
	ident := NodeIdentityKey(req.TPM, req.Facts)
	idKey := identityKey(s.Pool, ident)
	var n *Node
	reclaimed := false
	if ident != "" {
		holder, held, err := tx.getString(idKey)
		if err != nil {
			return Outcome{}, err
		}
		if held {
			var old Node
			found, err := tx.getJSON(nodeKey(holder), &old)
			if err != nil {
				return Outcome{}, err
			}
			if found && old.Active() {
				if !s.AllowReclaim {
					return c.refuse(tx, s, wire.CodeNodeExists, "a node with this machine's identity is already joined ("+old.ID+"); revoke it or use a code that allows reclaim", map[string]any{"nodeId": old.ID}), nil
				}
				if old.CertSerial != "" {
					old.RevokedSerials = append(old.RevokedSerials, old.CertSerial)
				}
				old.Generation++ // every certificate issued before stops renewing
				n, reclaimed = &old, true
			}
		}
	}
	if n == nil {
		id, err := req.NewNodeID()
		if err != nil {
			return Outcome{}, err
		}
		n = &Node{ID: id, State: nodeActive}
	}
	if ident != "" {
		tx.putString(idKey, n.ID)
	}
	n.Pool, n.Tenant, n.IdentityKey, n.Facts = s.Pool, s.Tenant, ident, factsFrom(req.Facts)
	n.Role, n.Trust, n.SecretID, n.JoinID, n.KeyFP = s.Role, s.Trust, s.ID, j.ID, req.KeyFP
	n.JoinedAt, n.TPM = now, req.TPM
	if s.Key != nil {
		host, err := assignHost(tx, s, n, req.Facts)
		if errors.Is(err, errNoAddresses) {
			return c.refuse(tx, s, wire.CodeAddressExhausted, err.Error(), nil), nil
		}
		if err != nil {
			return Outcome{}, err
		}
		n.Host = host
	}
	cert, err := req.Issue(n.ID, n.Role)
	if err != nil {
		return Outcome{}, err
	}
	n.CertSerial, n.NotAfter = cert.Serial, cert.NotAfter
	j.State, j.NodeID = joinCompleted, n.ID
	s.Registrations++
	tx.put(nodeKey(n.ID), n)
	tx.put(joinKey(j.ID), j)
	tx.putString(serialKey(cert.Serial), serialOwner(n))
	fields := map[string]any{"nodeId": n.ID, "secretId": s.ID, "pool": s.Pool, "role": n.Role, "trust": n.Trust}
	if req.Remote != "" {
		fields["remoteAddr"] = req.Remote
	}
	if req.TPM != nil {
		fields["ekHash"] = req.TPM.EKHash
	}
	if reclaimed {
		tx.event(EventNodeReclaimed, SystemActor, fields)
	} else {
		tx.event(EventNodeJoined, SystemActor, fields)
	}
	return Outcome{Status: wire.StatusJoined, Join: j, Node: n, Cert: cert}, nil
}

var errNoAddresses = errors.New("no addresses left")

var hostnameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// assignHost gives a join-key host its network, role, tags, one address
// from each CIDR and a name. Addresses are counted per network in the
// join's transaction (addr/<network>/<cidr>), so no two hosts of a network
// get the same address, whichever keys they enrolled with.
func assignHost(tx *txn, s *Secret, n *Node, f wire.Facts) (*Host, error) {
	if n.Host != nil { // a reclaimed host keeps its addresses
		return n.Host, nil
	}
	h := &Host{NetworkID: s.Key.NetworkID, RoleID: s.Key.RoleID, Tags: s.Key.Tags}
	name := strings.ToLower(strings.SplitN(f.Hostname, ".", 2)[0])
	if hostnameRE.MatchString(name) && name != "localhost" {
		h.Name = name
	} else {
		h.Name = s.Key.Name + "-" + randomID("", 3)
	}
	for _, cidr := range s.Key.CIDRs {
		p, err := netip.ParsePrefix(cidr)
		if err != nil {
			return nil, fmt.Errorf("bad cidr %q: %w", cidr, err)
		}
		key := addrKey(s.Key.NetworkID, cidr)
		last, err := tx.getCount(key)
		if err != nil {
			return nil, err
		}
		next := last + 1 // skip the network address
		addr, ok := nthAddr(p, next)
		if !ok {
			return nil, fmt.Errorf("%w in %s", errNoAddresses, cidr)
		}
		tx.putCount(key, next)
		h.Addresses = append(h.Addresses, netip.PrefixFrom(addr, p.Bits()).String())
	}
	return h, nil
}

// nthAddr is the n-th address of p, refusing the last (broadcast for IPv4).
func nthAddr(p netip.Prefix, n uint64) (netip.Addr, bool) {
	a := p.Masked().Addr().As16()
	carry := n
	for i := 15; i >= 0 && carry > 0; i-- {
		sum := uint64(a[i]) + carry&0xff
		a[i] = byte(sum)
		carry = carry>>8 + sum>>8
	}
	addr := netip.AddrFrom16(a)
	if p.Addr().Is4() {
		addr = addr.Unmap()
	}
	hostBits := addr.BitLen() - p.Bits()
	if !p.Contains(addr) || (hostBits < 64 && n >= (uint64(1)<<hostBits)-1) {
		return netip.Addr{}, false
	}
	return addr, true
}

// RenewRequest renews the certificate of a node that proved possession
// of a certificate with serial Serial.
type RenewRequest struct {
	NodeID string
	Serial string
	KeyFP  string
	Issue  Issuer
}

// Renew issues a node a new certificate, unless it was revoked or the
// certificate it presented was revoked by a reclaim.
func (c *Cluster) Renew(ctx context.Context, req RenewRequest) (Outcome, error) {
	req.Issue = memoIssue(req.Issue)
	var out Outcome
	err := c.update(ctx, func(tx *txn) error {
		var n Node
		found, err := tx.getJSON(nodeKey(req.NodeID), &n)
		if err != nil {
			return err
		}
		if !found {
			out = refused(wire.CodeNodeUnknown, "the listener does not know this node; join again with a new code")
			return nil
		}
		if !n.Active() {
			out = refused(wire.CodeNodeRevoked, "this node was revoked; join again with a new code")
			return nil
		}
		// the serial index is compared at commit too: a reclaim that
		// moves it between this read and the write stops the renewal
		owner, _, err := tx.getString(serialKey(req.Serial))
		if err != nil {
			return err
		}
		if owner != serialOwner(&n) || slicesContains(n.RevokedSerials, req.Serial) {
			out = refused(wire.CodeNodeRevoked, "this certificate was revoked when the machine was reclaimed; join again with a new code")
			return nil
		}
		// An attested key is the node's identity: a renewal into any other
		// key would carry the node out of its TPM.
		if n.TPM != nil && req.KeyFP != n.KeyFP {
			out = refused(wire.CodeTPMKeyChanged, "this node's key was attested to live in a TPM, and the renewal asks for another key; join again with a new code")
			return nil
		}
		cert, err := req.Issue(n.ID, n.Role)
		if err != nil {
			return err
		}
		now := c.now().UTC()
		n.CertSerial, n.NotAfter, n.RenewedAt, n.KeyFP = cert.Serial, cert.NotAfter, &now, req.KeyFP
		tx.put(nodeKey(n.ID), n)
		tx.putString(serialKey(cert.Serial), serialOwner(&n))
		tx.event(EventNodeRenewed, SystemActor, map[string]any{"nodeId": n.ID, "notAfter": cert.NotAfter.UTC().Format(time.RFC3339)})
		out = Outcome{Status: wire.StatusJoined, Node: &n, Cert: cert}
		return nil
	})
	if err != nil {
		return Outcome{}, fmt.Errorf("commit renewal: %w", err)
	}
	return out, nil
}

// serialOwner is what the serial index records for a certificate issued
// to n now: its node id, and after a reclaim also the node's generation.
// Renew accepts only certificates of the current generation, so a reclaim
// stops every certificate the machine held before (an earlier one that was
// renewed since is as good as the last to a holder of the old key), not
// just the last one.
func serialOwner(n *Node) string {
	if n.Generation == 0 {
		return n.ID
	}
	return n.ID + "#" + strconv.Itoa(n.Generation)
}

func slicesContains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// ResetAttempts forgets the failed attempts of a live secret: its count
// drops to the attempts still in flight, and its orphans are cleared. It
// is the operator's way out for a code whose holders lost their attempts
// (a machine reinstalled with its state), recorded as an event.
func (c *Cluster) ResetAttempts(ctx context.Context, id, actor string) (*Secret, error) {
	var s Secret
	err := c.update(ctx, func(tx *txn) error {
		s = Secret{}
		found, err := tx.getJSON(secretKey(id), &s)
		if err != nil {
			return err
		}
		if !found {
			return ErrNotFound
		}
		now := c.now().UTC()
		if !s.Live(now) {
			return fmt.Errorf("%w: %s is %s; only a live secret's attempts can be reset", ErrInvalidState, id, s.State(now))
		}
		s.liveLeases(now)
		before := s.Unproven
		s.Unproven, s.Orphans, s.ModifiedAt = len(s.Leases), nil, now
		tx.put(secretKey(id), s)
		tx.event(EventAttemptsReset, actor, map[string]any{"id": id, "kind": s.Kind, "failedAttemptsBefore": before - len(s.Leases), "inFlight": len(s.Leases)})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reset attempts: %w", err)
	}
	return &s, nil
}

// resume finds the counted attempt that asked guess, orphaned or still
// leased (its connection died with a listener), and leases it again.
func (s *Secret) resume(guess string, now time.Time) (Lease, bool) {
	l := Lease{ID: randomID("", 8), Until: now.Add(LeaseTime), Guess: guess}
	if i := slices.IndexFunc(s.Orphans, func(o Orphan) bool { return o.Guess == guess }); i >= 0 {
		l.Commit = s.Orphans[i].Commit
		s.Orphans = slices.Delete(s.Orphans, i, i+1)
		s.Leases = append(s.Leases, l)
		return l, true
	}
	if i := slices.IndexFunc(s.Leases, func(x Lease) bool { return x.Guess == guess }); i >= 0 {
		l.Commit = s.Leases[i].Commit
		s.Leases[i] = l
		return l, true
	}
	return Lease{}, false
}

// proven ends the lease of a proven attempt and reports whether the
// attempt was still counted: an attempt that carried a commitment or a
// guess may have been taken over by a resumed start, or refunded, and is
// then un-counted there, not twice.
func (s *Secret) proven(att Attempt) bool {
	before := len(s.Leases)
	s.dropLease(att.LeaseID, false)
	if len(s.Leases) != before {
		return true
	}
	if att.Commit == "" && att.Guess == "" {
		return true // an attempt of an agent that sends neither: as before
	}
	// its lease expired into an orphan meanwhile
	i := slices.IndexFunc(s.Orphans, func(o Orphan) bool {
		return (att.Commit != "" && o.Commit == att.Commit) || (att.Guess != "" && o.Guess == att.Guess)
	})
	if i < 0 {
		return false
	}
	s.Orphans = slices.Delete(s.Orphans, i, i+1)
	return true
}
