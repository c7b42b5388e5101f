package cluster

import (
	"context"
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
	"github.com/stratumjoin/stratum/internal/wire"
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
	locks  secretLocks
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

	// The store's failures, named for callers that never see the store:
	// no answer within the deadline, a full disk, a damaged file.
	ErrStoreUnavailable = store.ErrUnavailable
	ErrStoreFull        = store.ErrNoSpace
	ErrStoreDamaged     = store.ErrCorrupt
)

func (c *Cluster) newEvent(typ, actor string, fields map[string]any) (Event, store.Op) {
	now := c.now().UTC()
	ev := Event{Seq: c.seq.next(now), Type: typ, Time: now, Actor: actor, Fields: fields}
	return ev, putJSON(eventKey(ev.Seq), ev)
}

// logEvents logs events after their transaction committed.
func (c *Cluster) logEvents(evs ...Event) {
	// the attributes cost more than the check: every join logs one event
	if len(evs) == 0 || !c.logger.Enabled(context.Background(), slog.LevelInfo) {
		return
	}
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
	Secret      Secret // ID, Kind and the policy fields; Locator, Record, Index and counters are set by Mint
	Mint        MintFunc
	EventType   string
	EventFields map[string]any
	// PerOrgLimit, when > 0, bounds how many join keys the key's
	// organization may hold.
	PerOrgLimit int
}

// Mint stores a new secret. For codes it picks a selector no live code
// holds; the record is minted for the chosen locator. For tokens and keys
// the record is minted once for the secret's id and stored only if the id
// is free: ErrExists when the id is taken (an idempotent retry),
// ErrNameTaken when a join key's name is taken in its organization,
// ErrQuotaExceeded when the organization holds PerOrgLimit keys already.
func (c *Cluster) Mint(ctx context.Context, spec SecretSpec) (*Secret, joincode.Secret, error) {
	s := spec.Secret
	now := c.now().UTC()
	s.CreatedAt, s.ModifiedAt = now, now
	s.Index = indexKeys(&s)
	if s.Kind == KindCode {
		return c.mintCode(ctx, spec, s)
	}
	sec, rec, err := spec.Mint(s.ID)
	if err != nil {
		return nil, joincode.Secret{}, err
	}
	s.Locator, s.Record = sec.Locator, rec
	err = c.update(ctx, func(tx *txn) error {
		if _, found, err := tx.getString(secretKey(s.ID)); err != nil {
			return err
		} else if found {
			return ErrExists
		}
		if s.Key != nil {
			name := keyNameKey(s.Key.OrgID, s.Key.Name)
			if _, found, err := tx.getString(name); err != nil {
				return err
			} else if found {
				return ErrNameTaken
			}
			tx.putString(name, s.ID)
		}
		for _, k := range append([]string{locatorKey(s.Locator)}, s.Index...) {
			if _, found, err := tx.getString(k); err != nil {
				return err
			} else if found {
				return ErrExists
			}
			tx.putString(k, s.ID)
		}
		if spec.PerOrgLimit > 0 && s.Key != nil {
			key := keyCountKey(s.Key.OrgID)
			n, err := tx.getCount(key)
			if err != nil {
				return err
			}
			if n >= uint64(spec.PerOrgLimit) {
				return ErrQuotaExceeded
			}
			tx.putCount(key, n+1)
		}
		tx.put(secretKey(s.ID), s)
		tx.event(spec.EventType, s.CreatedBy, spec.EventFields)
		return nil
	})
	if err != nil {
		return nil, joincode.Secret{}, fmt.Errorf("store secret: %w", err)
	}
	return &s, sec, nil
}

// errSelectorTaken makes mintCode try the next selector.
var errSelectorTaken = errors.New("selector held by a live code")

func (c *Cluster) mintCode(ctx context.Context, spec SecretSpec, s Secret) (*Secret, joincode.Secret, error) {
	order := rand.Perm(joincode.Selectors)
	for _, i := range order {
		sel := joincode.SelectorAt(i)
		var sec joincode.Secret
		err := c.update(ctx, func(tx *txn) error {
			holder, held, err := tx.getString(locatorKey(sel))
			if err != nil {
				return err
			}
			if held {
				var old Secret
				found, err := tx.getJSON(secretKey(holder), &old)
				if err != nil {
					return err
				}
				if found && old.Live(c.now()) {
					return errSelectorTaken
				}
			}
			if _, found, err := tx.getString(secretKey(s.ID)); err != nil {
				return err
			} else if found {
				return ErrExists
			}
			if sec.Locator == "" { // mint once per selector, not per round
				var rec []byte
				if sec, rec, err = spec.Mint(sel); err != nil {
					return err
				}
				s.Locator, s.Record = sel, rec
			}
			fields := maps.Clone(spec.EventFields)
			if fields == nil {
				fields = map[string]any{}
			}
			fields["id"], fields["selector"] = s.ID, sel
			tx.put(secretKey(s.ID), s)
			tx.putString(locatorKey(sel), s.ID)
			tx.event(spec.EventType, s.CreatedBy, fields)
			return nil
		})
		if errors.Is(err, errSelectorTaken) {
			continue
		}
		if err != nil {
			return nil, joincode.Secret{}, fmt.Errorf("store code: %w", err)
		}
		return &s, sec, nil
	}
	return nil, joincode.Secret{}, ErrLimitExceeded
}

// Secret returns a secret by id.
func (c *Cluster) Secret(ctx context.Context, id string) (*Secret, error) {
	var s Secret
	found, err := getJSON(ctx, c.store, secretKey(id), &s)
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, ErrNotFound
	}
	return &s, nil
}

// secretByLocator reads the secret a locator points at in tx; nil when
// none.
func secretByLocator(tx *txn, locator string) (*Secret, error) {
	id, found, err := tx.getString(locatorKey(locator))
	if err != nil || !found {
		return nil, err
	}
	var s Secret
	found, err = tx.getJSON(secretKey(id), &s)
	if err != nil || !found {
		return nil, err
	}
	return &s, nil
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

// RevokeSecret revokes a secret at once. It returns the record and whether
// this call revoked it; revoking a revoked secret changes nothing and
// publishes nothing.
func (c *Cluster) RevokeSecret(ctx context.Context, id, actor, eventType string, fields map[string]any) (*Secret, bool, error) {
	var s Secret
	var did bool
	err := c.update(ctx, func(tx *txn) error {
		s, did = Secret{}, false
		found, err := tx.getJSON(secretKey(id), &s)
		if err != nil {
			return err
		}
		if !found {
			return ErrNotFound
		}
		if s.RevokedAt != nil {
			return nil
		}
		now := c.now().UTC()
		s.RevokedAt, s.RevokedBy, s.ModifiedAt = &now, actor, now
		f := maps.Clone(fields)
		if f == nil {
			f = map[string]any{}
		}
		f["id"] = id
		tx.put(secretKey(id), s)
		tx.event(eventType, actor, f)
		did = true
		return nil
	})
	if err != nil {
		return nil, false, fmt.Errorf("revoke: %w", err)
	}
	return &s, did, nil
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

// DeleteSecret removes a secret, its locator, its listing keys and, for a
// join key, its name reservation and its place in the organization's count.
func (c *Cluster) DeleteSecret(ctx context.Context, id, actor, eventType string) error {
	err := c.update(ctx, func(tx *txn) error {
		var s Secret
		found, err := tx.getJSON(secretKey(id), &s)
		if err != nil {
			return err
		}
		if !found {
			return ErrNotFound
		}
		tx.del(secretKey(id))
		tx.del(locatorKey(s.Locator))
		for _, k := range s.Index {
			tx.del(k)
		}
		if s.Key != nil {
			tx.del(keyNameKey(s.Key.OrgID, s.Key.Name))
			key := keyCountKey(s.Key.OrgID)
			n, err := tx.getCount(key)
			if err != nil {
				return err
			}
			if n > 0 {
				n--
			}
			tx.putCount(key, n)
		}
		tx.event(eventType, actor, map[string]any{"id": id})
		return nil
	})
	if err != nil {
		return fmt.Errorf("delete: %w", err)
	}
	return nil
}

// Events lists events after seq (exclusive), oldest first.
func (c *Cluster) Events(ctx context.Context, afterSeq string, limit int) ([]Event, error) {
	after := ""
	if afterSeq != "" {
		after = eventKey(afterSeq)
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
	found, err := getJSON(ctx, c.store, nodeKey(id), &n)
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
	var n Node
	err := c.update(ctx, func(tx *txn) error {
		n = Node{}
		found, err := tx.getJSON(nodeKey(id), &n)
		if err != nil {
			return err
		}
		if !found {
			return ErrNotFound
		}
		if n.State == nodeRevoked {
			return nil
		}
		return c.revokeNode(tx, &n, actor, nil)
	})
	if err != nil {
		return nil, fmt.Errorf("revoke node: %w", err)
	}
	return &n, nil
}

// revokeNode marks n revoked by actor and frees its identity, in tx.
func (c *Cluster) revokeNode(tx *txn, n *Node, actor string, fields map[string]any) error {
	now := c.now().UTC()
	n.State, n.RevokedAt, n.RevokedBy = nodeRevoked, &now, actor
	idKey := identityKey(n.Pool, n.IdentityKey)
	holder, _, err := tx.getString(idKey)
	if err != nil {
		return err
	}
	tx.put(nodeKey(n.ID), *n)
	if holder == n.ID && n.IdentityKey != "" {
		tx.del(idKey)
	}
	ev := map[string]any{"nodeId": n.ID}
	for k, v := range fields {
		ev[k] = v
	}
	tx.event(EventNodeRevoked, actor, ev)
	return nil
}

// NodeActor is the actor of what a node does itself (its leave).
func NodeActor(id string) string { return "node:" + id }

// LeaveRequest is a node asking to leave: NodeID and Serial come from the
// certificate it presented over mutual TLS.
type LeaveRequest struct {
	NodeID string
	Serial string
}

// Leave revokes a node at its own request, as RevokeNode does, with the
// node as the event's actor. The certificate must be one Renew would
// accept (the node's current generation, not revoked by a reclaim), so a
// stolen older certificate cannot revoke the node that replaced it. The
// outcome is StatusLeft, or refused NODE_UNKNOWN or NODE_REVOKED.
func (c *Cluster) Leave(ctx context.Context, req LeaveRequest) (Outcome, error) {
	var out Outcome
	err := c.update(ctx, func(tx *txn) error {
		var n Node
		found, err := tx.getJSON(nodeKey(req.NodeID), &n)
		if err != nil {
			return err
		}
		if !found {
			out = refused(wire.CodeNodeUnknown, "the listener does not know this node")
			return nil
		}
		if !n.Active() {
			out = refused(wire.CodeNodeRevoked, "this node was already revoked")
			return nil
		}
		owner, _, err := tx.getString(serialKey(req.Serial))
		if err != nil {
			return err
		}
		if owner != serialOwner(&n) || slicesContains(n.RevokedSerials, req.Serial) {
			out = refused(wire.CodeNodeRevoked, "this certificate was revoked when the machine was reclaimed")
			return nil
		}
		if err := c.revokeNode(tx, &n, NodeActor(n.ID), map[string]any{"reason": "leave"}); err != nil {
			return err
		}
		out = Outcome{Status: wire.StatusLeft, Node: &n}
		return nil
	})
	if err != nil {
		return Outcome{}, fmt.Errorf("commit leave: %w", err)
	}
	return out, nil
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
	found, err := getJSON(ctx, c.store, joinKey(id), &j)
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, ErrNotFound
	}
	return &j, nil
}

// WatchJoin watches one join's record: the channel receives a value after
// each committed change of it (a decision among them) and is closed when
// ctx ends or the watch breaks. It is nil, with no error, when the store
// cannot watch.
func (c *Cluster) WatchJoin(ctx context.Context, id string) (<-chan struct{}, error) {
	w, ok := c.store.(store.Watcher)
	if !ok {
		return nil, nil
	}
	ch, err := w.Watch(ctx, joinKey(id))
	if err != nil {
		return nil, fmt.Errorf("watch join %s: %w", id, err)
	}
	return ch, nil
}

// ErrSASMismatch means an approval named a short authentication string
// other than the join's: the machine the approver stands at is not the one
// that made this join. The join stays pending.
var ErrSASMismatch = errors.New("the short authentication string does not match this join's")

// DecideJoin approves or refuses a pending join. A non-empty sas must be
// the join's SAS, or the approval is refused with ErrSASMismatch and the
// join stays pending.
func (c *Cluster) DecideJoin(ctx context.Context, id, actor string, approve bool, sas string) (*Join, error) {
	var j Join
	err := c.update(ctx, func(tx *txn) error {
		j = Join{}
		found, err := tx.getJSON(joinKey(id), &j)
		if err != nil {
			return err
		}
		if !found {
			return ErrNotFound
		}
		if j.State != joinPending {
			return fmt.Errorf("%w: join %s is %s", ErrInvalidState, id, j.State)
		}
		if approve && sas != "" && normalSAS(sas) != j.SAS {
			return ErrSASMismatch
		}
		now := c.now().UTC()
		j.DecidedAt, j.DecidedBy = &now, actor
		typ := EventJoinApproved
		j.State = joinApproved
		if !approve {
			j.State, typ = joinRefused, EventJoinRefusedAdmin
		}
		tx.put(joinKey(id), j)
		tx.event(typ, actor, map[string]any{"joinId": id, "secretId": j.SecretID})
		return nil
	})
	if errors.Is(err, ErrInvalidState) || errors.Is(err, ErrSASMismatch) {
		return &j, err
	}
	if err != nil {
		return nil, fmt.Errorf("decide join: %w", err)
	}
	return &j, nil
}

// normalSAS drops the spaces and hyphens a person may type between digits.
func normalSAS(s string) string {
	return strings.NewReplacer(" ", "", "-", "").Replace(s)
}

// IsPending reports whether a join waits for a decision.
func (j *Join) IsPending() bool { return j.State == joinPending }

// Active reports whether a node is active.
func (n *Node) Active() bool { return n.State == nodeActive }

// Record appends a standalone event.
func (c *Cluster) Record(ctx context.Context, typ, actor string, fields map[string]any) error {
	err := c.update(ctx, func(tx *txn) error {
		tx.event(typ, actor, fields)
		return nil
	})
	if err != nil {
		return fmt.Errorf("record event: %w", err)
	}
	return nil
}

// SchemaVersion is the store layout this build reads and writes (the keys
// in keys.go and the records in model.go). A store written by a newer
// layout is refused, so listeners sharing one etcd survive a rolling
// upgrade: the old ones stop rather than misread the new records.
const SchemaVersion = 1

// ErrSchema means the store was written by a newer layout.
var ErrSchema = errors.New("store schema is newer than this listener")

// CheckSchema records SchemaVersion in a store that holds none (a new
// store, or one written before the version was recorded, whose layout is
// version 1) and refuses a store of a newer version.
func (c *Cluster) CheckSchema(ctx context.Context) error {
	var stored uint64
	err := c.update(ctx, func(tx *txn) error {
		n, err := tx.getCount(keySchema)
		if err != nil {
			return err
		}
		stored = n
		if n == 0 {
			tx.putCount(keySchema, SchemaVersion)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("store schema version: %w", err)
	}
	if stored > SchemaVersion {
		return fmt.Errorf("%w: it holds schema version %d, this listener reads version %d; upgrade this listener", ErrSchema, stored, SchemaVersion)
	}
	return nil
}
