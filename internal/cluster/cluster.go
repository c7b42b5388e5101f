package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/stratumjoin/stratum/internal/joincode"
	"github.com/stratumjoin/stratum/internal/store"
)

// Config wires a Cluster.
type Config struct {
	Store  store.Store
	Logger *slog.Logger     // events are also logged here as structured records
	Now    func() time.Time // injected clock; time.Now when nil
}

// Cluster applies the join rules to the store.
type Cluster struct {
	store  store.Store
	logger *slog.Logger
	now    func() time.Time
	seq    eventSeq
}

// New returns a Cluster over cfg.Store.
func New(cfg Config) *Cluster {
	c := &Cluster{store: cfg.Store, logger: cfg.Logger, now: cfg.Now}
	if c.logger == nil {
		c.logger = slog.New(slog.DiscardHandler)
	}
	if c.now == nil {
		c.now = time.Now
	}
	return c
}

// Now is the cluster's clock.
func (c *Cluster) Now() time.Time { return c.now() }

// Store returns the underlying store.
func (c *Cluster) Store() store.Store { return c.store }

var (
	// ErrNotFound means no such record.
	ErrNotFound = errors.New("not found")
	// ErrLimitExceeded means every selector is taken by a live code.
	ErrLimitExceeded = errors.New("every join code selector is in use by a live code")
	// ErrExists means a record with that id or name exists.
	ErrExists = errors.New("already exists")
	// ErrQuotaExceeded means an organization holds SecretSpec.PerOrgLimit
	// secrets of a kind already.
	ErrQuotaExceeded = errors.New("the organization's limit of this kind of secret is reached")
	// ErrNameTaken means SecretSpec.UniqueName is held by another secret;
	// it matches ErrExists too.
	ErrNameTaken = fmt.Errorf("name %w", ErrExists)
	// ErrInvalidState means the record is not in a state that allows this.
	ErrInvalidState = errors.New("invalid state")
)

func (c *Cluster) newEvent(typ, actor string, fields map[string]any) (Event, store.Op) {
	now := c.now().UTC()
	ev := Event{Seq: c.seq.next(now), Type: typ, Time: now, Actor: actor, Fields: fields}
	return ev, putJSON(pfxEvent+ev.Seq, ev)
}

// logEvents logs events after their transaction committed.
func (c *Cluster) logEvents(evs ...Event) {
	for _, ev := range evs {
		attrs := []any{slog.String("event", ev.Type), slog.String("seq", ev.Seq)}
		if ev.Actor != "" {
			attrs = append(attrs, slog.String("actor", ev.Actor))
		}
		keys := slices.Sorted(maps.Keys(ev.Fields))
		for _, k := range keys {
			attrs = append(attrs, slog.Any(k, ev.Fields[k]))
		}
		c.logger.Info("event", attrs...)
	}
}

// MintFunc makes the OPAQUE record for a secret whose locator is known.
// It returns the secret for display (shown once) and its record.
type MintFunc func(locator string) (secret joincode.Secret, record []byte, err error)

// SecretSpec is what a mint stores beside the record.
type SecretSpec struct {
	Secret      Secret // ID, Kind and the policy fields; Locator, Record and counters are set by Mint
	Mint        MintFunc
	EventType   string
	EventFields map[string]any
	// UniqueName, when set, is reserved under name/<UniqueName> (join key names).
	UniqueName string
	// PerOrgLimit, when > 0, bounds how many secrets of this kind OrgKey may hold.
	PerOrgLimit int
	OrgKey      string
}

// Mint stores a new secret. For codes it picks a selector no live code
// holds; the record is minted for the chosen locator. For tokens and keys
// the record is minted once for the secret's id and stored with a
// create-if-absent transaction: ErrExists when the id is taken (an
// idempotent retry), ErrNameTaken when UniqueName is, ErrQuotaExceeded when
// OrgKey holds PerOrgLimit secrets already.
func (c *Cluster) Mint(ctx context.Context, spec SecretSpec) (*Secret, joincode.Secret, error) {
	s := spec.Secret
	now := c.now().UTC()
	s.CreatedAt, s.ModifiedAt = now, now
	if s.Kind == KindCode {
		return c.mintCode(ctx, spec, s)
	}
	sec, rec, err := spec.Mint(s.ID)
	if err != nil {
		return nil, joincode.Secret{}, err
	}
	s.Locator, s.Record = sec.Locator, rec
	for range maxCASRounds {
		ev, evOp := c.newEvent(spec.EventType, s.CreatedBy, spec.EventFields)
		cmps := []store.Cmp{{Key: pfxSecret + s.ID}, {Key: pfxLocator + s.Locator}}
		ops := []store.Op{putJSON(pfxSecret+s.ID, s), putString(pfxLocator+s.Locator, s.ID), evOp}
		if spec.UniqueName != "" {
			cmps = append(cmps, store.Cmp{Key: "name/" + spec.UniqueName})
			ops = append(ops, putString("name/"+spec.UniqueName, s.ID))
		}
		for _, k := range s.Index {
			cmps = append(cmps, store.Cmp{Key: k})
			ops = append(ops, putString(k, s.ID))
		}
		var countRev int64
		if spec.PerOrgLimit > 0 {
			cnt, rev, err := getString(ctx, c.store, "count/"+spec.OrgKey)
			if err != nil {
				return nil, joincode.Secret{}, err
			}
			var n int
			fmt.Sscan(cnt, &n)
			if n >= spec.PerOrgLimit {
				return nil, joincode.Secret{}, ErrQuotaExceeded
			}
			countRev = rev
			cmps = append(cmps, store.Cmp{Key: "count/" + spec.OrgKey, Rev: rev})
			ops = append(ops, putString("count/"+spec.OrgKey, fmt.Sprint(n+1)))
		}
		ok, err := c.store.Txn(ctx, cmps, ops)
		if err != nil {
			return nil, joincode.Secret{}, fmt.Errorf("store secret: %w", err)
		}
		if ok {
			c.logEvents(ev)
			return &s, sec, nil
		}
		// Find which guard failed: only a moved counter is worth another round.
		if err := c.mintGuardFailed(ctx, spec, s.ID, countRev); err != nil {
			return nil, joincode.Secret{}, err
		}
	}
	return nil, joincode.Secret{}, ErrConflict
}

// mintGuardFailed names the guard that made a mint transaction fail, or
// returns nil when only the per-organization counter moved.
func (c *Cluster) mintGuardFailed(ctx context.Context, spec SecretSpec, id string, countRev int64) error {
	if _, rev, err := getString(ctx, c.store, pfxSecret+id); err != nil {
		return err
	} else if rev != 0 {
		return ErrExists
	}
	if spec.UniqueName != "" {
		if _, rev, err := getString(ctx, c.store, "name/"+spec.UniqueName); err != nil {
			return err
		} else if rev != 0 {
			return ErrNameTaken
		}
	}
	if spec.PerOrgLimit == 0 {
		return ErrExists // the locator or an index key is taken
	}
	if _, rev, err := getString(ctx, c.store, "count/"+spec.OrgKey); err != nil {
		return err
	} else if rev == countRev {
		return ErrExists
	}
	return nil
}

func (c *Cluster) mintCode(ctx context.Context, spec SecretSpec, s Secret) (*Secret, joincode.Secret, error) {
	order := rand.Perm(joincode.Selectors)
	for _, i := range order {
		sel := joincode.SelectorAt(i)
		lockey := pfxLocator + sel
		holder, lrev, err := getString(ctx, c.store, lockey)
		if err != nil {
			return nil, joincode.Secret{}, err
		}
		cmps := []store.Cmp{{Key: lockey, Rev: lrev}, {Key: pfxSecret + s.ID}}
		if lrev != 0 {
			var old Secret
			orev, found, err := getJSON(ctx, c.store, pfxSecret+holder, &old)
			if err != nil {
				return nil, joincode.Secret{}, err
			}
			if found && old.Live(c.now()) {
				continue
			}
			cmps = append(cmps, store.Cmp{Key: pfxSecret + holder, Rev: orev})
		}
		sec, rec, err := spec.Mint(sel)
		if err != nil {
			return nil, joincode.Secret{}, err
		}
		s.Locator, s.Record = sel, rec
		fields := maps.Clone(spec.EventFields)
		if fields == nil {
			fields = map[string]any{}
		}
		fields["id"], fields["selector"] = s.ID, sel
		ev, evOp := c.newEvent(spec.EventType, s.CreatedBy, fields)
		ok, err := c.store.Txn(ctx, cmps, []store.Op{putJSON(pfxSecret+s.ID, s), putString(lockey, s.ID), evOp})
		if err != nil {
			return nil, joincode.Secret{}, fmt.Errorf("store code: %w", err)
		}
		if ok {
			c.logEvents(ev)
			return &s, sec, nil
		}
	}
	return nil, joincode.Secret{}, ErrLimitExceeded
}

// Secret returns a secret by id.
func (c *Cluster) Secret(ctx context.Context, id string) (*Secret, error) {
	var s Secret
	_, found, err := getJSON(ctx, c.store, pfxSecret+id, &s)
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, ErrNotFound
	}
	return &s, nil
}

// SecretByLocator returns the secret a locator points at, or ErrNotFound.
func (c *Cluster) SecretByLocator(ctx context.Context, locator string) (*Secret, int64, error) {
	id, rev, err := getString(ctx, c.store, pfxLocator+locator)
	if err != nil {
		return nil, 0, err
	}
	if rev == 0 {
		return nil, 0, ErrNotFound
	}
	var s Secret
	srev, found, err := getJSON(ctx, c.store, pfxSecret+id, &s)
	if err != nil {
		return nil, 0, err
	}
	if !found {
		return nil, 0, ErrNotFound
	}
	return &s, srev, nil
}

// Secrets lists secrets of a kind (all kinds when kind is ""), in id order.
func (c *Cluster) Secrets(ctx context.Context, kind string) ([]Secret, error) {
	all, err := listJSON[Secret](ctx, c.store, pfxSecret, "", 0)
	if err != nil {
		return nil, err
	}
	out := all[:0]
	for _, s := range all {
		if kind == "" || s.Kind == kind {
			out = append(out, s)
		}
	}
	return out, nil
}

// SecretsPage lists secrets with ids starting with idPrefix after `after`.
func (c *Cluster) SecretsPage(ctx context.Context, idPrefix, after string, limit int) ([]Secret, error) {
	if after != "" {
		after = pfxSecret + after
	}
	kvs, err := c.store.List(ctx, pfxSecret+idPrefix, after, limit)
	if err != nil {
		return nil, err
	}
	out := make([]Secret, 0, len(kvs))
	for _, kv := range kvs {
		var s Secret
		if err := unmarshal(kv.Value, &s); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

// RevokeSecret revokes a secret at once. It returns the record and whether
// this call revoked it; revoking a revoked secret changes nothing and
// publishes nothing.
func (c *Cluster) RevokeSecret(ctx context.Context, id, actor, eventType string, fields map[string]any) (*Secret, bool, error) {
	for range maxCASRounds {
		var s Secret
		rev, found, err := getJSON(ctx, c.store, pfxSecret+id, &s)
		if err != nil {
			return nil, false, err
		}
		if !found {
			return nil, false, ErrNotFound
		}
		if s.RevokedAt != nil {
			return &s, false, nil
		}
		now := c.now().UTC()
		s.RevokedAt, s.RevokedBy, s.ModifiedAt = &now, actor, now
		f := maps.Clone(fields)
		if f == nil {
			f = map[string]any{}
		}
		f["id"] = id
		ev, evOp := c.newEvent(eventType, actor, f)
		ok, err := c.store.Txn(ctx, []store.Cmp{{Key: pfxSecret + id, Rev: rev}}, []store.Op{putJSON(pfxSecret+id, s), evOp})
		if err != nil {
			return nil, false, fmt.Errorf("revoke: %w", err)
		}
		if ok {
			c.logEvents(ev)
			return &s, true, nil
		}
	}
	return nil, false, ErrConflict
}

// RevokedEvent is the event type that announces the revocation of a
// secret of kind.
func RevokedEvent(kind string) string {
	switch kind {
	case KindToken:
		return EventTokenRevoked
	case KindKey:
		return EventKeyRevoked
	}
	return EventCodeRevoked
}

// RevokeUnderOtherRoots revokes, by actor, every unrevoked secret minted
// under a root other than currentFP that match selects (all when nil), one
// event each. It returns how many it revoked.
func (c *Cluster) RevokeUnderOtherRoots(ctx context.Context, currentFP, actor string, match func(*Secret) bool) (int, error) {
	all, err := c.Secrets(ctx, "")
	if err != nil {
		return 0, err
	}
	n := 0
	for i := range all {
		s := &all[i]
		if s.RevokedAt != nil || s.CAFingerprint == currentFP || match != nil && !match(s) {
			continue
		}
		_, did, err := c.RevokeSecret(ctx, s.ID, actor, RevokedEvent(s.Kind), map[string]any{"kind": s.Kind, "pool": s.Pool, "tenant": s.Tenant, "caFingerprint": s.CAFingerprint})
		if err != nil {
			return n, err
		}
		if did {
			n++
		}
	}
	return n, nil
}

// DeleteSecret removes a secret, its locator and its name reservation.
func (c *Cluster) DeleteSecret(ctx context.Context, id, actor, eventType, orgKey string) error {
	for range maxCASRounds {
		var s Secret
		rev, found, err := getJSON(ctx, c.store, pfxSecret+id, &s)
		if err != nil {
			return err
		}
		if !found {
			return ErrNotFound
		}
		ev, evOp := c.newEvent(eventType, actor, map[string]any{"id": id})
		cmps := []store.Cmp{{Key: pfxSecret + id, Rev: rev}}
		ops := []store.Op{{Key: pfxSecret + id, Delete: true}, {Key: pfxLocator + s.Locator, Delete: true}, evOp}
		if s.Key != nil {
			ops = append(ops, store.Op{Key: "name/" + s.Key.OrgID + "/" + s.Key.Name, Delete: true})
		}
		for _, k := range s.Index {
			ops = append(ops, store.Op{Key: k, Delete: true})
		}
		if orgKey != "" {
			cnt, crev, err := getString(ctx, c.store, "count/"+orgKey)
			if err != nil {
				return err
			}
			var n int
			fmt.Sscan(cnt, &n)
			if n > 0 {
				n--
			}
			cmps = append(cmps, store.Cmp{Key: "count/" + orgKey, Rev: crev})
			ops = append(ops, putString("count/"+orgKey, fmt.Sprint(n)))
		}
		ok, err := c.store.Txn(ctx, cmps, ops)
		if err != nil {
			return fmt.Errorf("delete: %w", err)
		}
		if ok {
			c.logEvents(ev)
			return nil
		}
	}
	return ErrConflict
}

// Events lists events after seq (exclusive), oldest first.
func (c *Cluster) Events(ctx context.Context, afterSeq string, limit int) ([]Event, error) {
	after := ""
	if afterSeq != "" {
		after = pfxEvent + afterSeq
	}
	return listJSON[Event](ctx, c.store, pfxEvent, after, limit)
}

// Nodes lists nodes in id order.
func (c *Cluster) Nodes(ctx context.Context) ([]Node, error) {
	return listJSON[Node](ctx, c.store, pfxNode, "", 0)
}

// Node returns one node.
func (c *Cluster) Node(ctx context.Context, id string) (*Node, error) {
	var n Node
	_, found, err := getJSON(ctx, c.store, pfxNode+id, &n)
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, ErrNotFound
	}
	return &n, nil
}

// RevokeNode revokes a node: its renewals are refused from now on, and
// its identity no longer blocks a new join.
func (c *Cluster) RevokeNode(ctx context.Context, id, actor string) (*Node, error) {
	for range maxCASRounds {
		var n Node
		rev, found, err := getJSON(ctx, c.store, pfxNode+id, &n)
		if err != nil {
			return nil, err
		}
		if !found {
			return nil, ErrNotFound
		}
		if n.State == nodeRevoked {
			return &n, nil
		}
		now := c.now().UTC()
		n.State, n.RevokedAt, n.RevokedBy = nodeRevoked, &now, actor
		idKey := pfxIdentity + n.Pool + "/" + n.IdentityKey
		holder, irev, err := getString(ctx, c.store, idKey)
		if err != nil {
			return nil, err
		}
		ev, evOp := c.newEvent(EventNodeRevoked, actor, map[string]any{"nodeId": id})
		cmps := []store.Cmp{{Key: pfxNode + id, Rev: rev}, {Key: idKey, Rev: irev}}
		ops := []store.Op{putJSON(pfxNode+id, n), evOp}
		if holder == id && n.IdentityKey != "" {
			ops = append(ops, store.Op{Key: idKey, Delete: true})
		}
		ok, err := c.store.Txn(ctx, cmps, ops)
		if err != nil {
			return nil, fmt.Errorf("revoke node: %w", err)
		}
		if ok {
			c.logEvents(ev)
			return &n, nil
		}
	}
	return nil, ErrConflict
}

// Joins lists joins, pending first then newest first.
func (c *Cluster) Joins(ctx context.Context) ([]Join, error) {
	js, err := listJSON[Join](ctx, c.store, pfxJoin, "", 0)
	if err != nil {
		return nil, err
	}
	sort.SliceStable(js, func(i, j int) bool {
		if (js[i].State == joinPending) != (js[j].State == joinPending) {
			return js[i].State == joinPending
		}
		return js[i].CreatedAt.After(js[j].CreatedAt)
	})
	return js, nil
}

// Join returns one join.
func (c *Cluster) Join(ctx context.Context, id string) (*Join, error) {
	var j Join
	_, found, err := getJSON(ctx, c.store, pfxJoin+id, &j)
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, ErrNotFound
	}
	return &j, nil
}

// ErrSASMismatch means an approval named a short authentication string
// other than the join's: the machine the approver stands at is not the one
// that made this join. The join stays pending.
var ErrSASMismatch = errors.New("the short authentication string does not match this join's")

// DecideJoin approves or refuses a pending join. A non-empty sas must be
// the join's SAS, or the approval is refused with ErrSASMismatch and the
// join stays pending.
func (c *Cluster) DecideJoin(ctx context.Context, id, actor string, approve bool, sas string) (*Join, error) {
	for range maxCASRounds {
		var j Join
		rev, found, err := getJSON(ctx, c.store, pfxJoin+id, &j)
		if err != nil {
			return nil, err
		}
		if !found {
			return nil, ErrNotFound
		}
		if j.State != joinPending {
			return &j, fmt.Errorf("%w: join %s is %s", ErrInvalidState, id, j.State)
		}
		if approve && sas != "" && normalSAS(sas) != j.SAS {
			return &j, ErrSASMismatch
		}
		now := c.now().UTC()
		j.DecidedAt, j.DecidedBy = &now, actor
		typ := EventJoinApproved
		j.State = joinApproved
		if !approve {
			j.State, typ = joinRefused, EventJoinRefusedAdmin
		}
		ev, evOp := c.newEvent(typ, actor, map[string]any{"joinId": id, "secretId": j.SecretID})
		ok, err := c.store.Txn(ctx, []store.Cmp{{Key: pfxJoin + id, Rev: rev}}, []store.Op{putJSON(pfxJoin+id, j), evOp})
		if err != nil {
			return nil, fmt.Errorf("decide join: %w", err)
		}
		if ok {
			c.logEvents(ev)
			return &j, nil
		}
	}
	return nil, ErrConflict
}

// normalSAS drops the spaces and hyphens a person may type between digits.
func normalSAS(s string) string {
	return strings.NewReplacer(" ", "", "-", "").Replace(s)
}

func unmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

// JoinState names, exported for the admin API.
func JoinStates() []string { return []string{joinPending, joinApproved, joinRefused, joinCompleted} }

// SecretState names the state for display.
func SecretState(s *Secret, now time.Time) string { return s.State(now) }

// IsPending reports whether a join waits for a decision.
func (j *Join) IsPending() bool { return j.State == joinPending }

// Active reports whether a node is active.
func (n *Node) Active() bool { return n.State == nodeActive }

// Record appends a standalone event.
func (c *Cluster) Record(ctx context.Context, typ, actor string, fields map[string]any) error {
	ev, op := c.newEvent(typ, actor, fields)
	if _, err := c.store.Txn(ctx, nil, []store.Op{op}); err != nil {
		return fmt.Errorf("record event: %w", err)
	}
	c.logEvents(ev)
	return nil
}
