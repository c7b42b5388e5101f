package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/stratumjoin/stratum/internal/store"
)

// The per-source budgets of unproven starts are kept in the store
// (budgetKey), so listeners that share a store share the budget.

// Budget bounds the unproven starts one source may have counted in any
// window of Window: an address, and the /24 (IPv4) or /64 (IPv6) it sits
// in. The window slides: each charge holds its slot for Window from the
// moment it was made, so a sweep that straddles a boundary gets no second
// budget. A proven start gives its charge back, so only guesses use it up.
type Budget struct {
	PerAddress int // 0: no limit on the address
	PerPrefix  int // 0: no limit on the prefix
	Window     time.Duration
}

// DefaultBudget is the budget a listener applies unless told otherwise:
// a sweep from one address reaches at most 8 codes in any 10 minutes, one
// from a /24 at most 32.
var DefaultBudget = Budget{PerAddress: 8, PerPrefix: 32, Window: 10 * time.Minute}

// Charge is one start charged to a source's budget; Refund gives it back.
type Charge struct {
	keys []string
	at   int64 // unix nanoseconds of the charge
}

// Charged reports whether the charge holds anything to refund.
func (ch Charge) Charged() bool { return len(ch.keys) > 0 }

// budgetEntry is one source's charges still inside the window, oldest
// first: at most its limit of them, so an entry stays small.
type budgetEntry struct {
	Charges []int64 `json:"charges"` // unix nanoseconds
}

// live drops the charges made at or before cutoff and sorts the rest: listeners
// sharing a store append with their own clocks.
func (e *budgetEntry) live(cutoff int64) {
	e.Charges = slices.DeleteFunc(e.Charges, func(at int64) bool { return at <= cutoff })
	slices.Sort(e.Charges)
}

// SourcePrefix is the prefix a source's address is also charged to.
func SourcePrefix(a netip.Addr) netip.Prefix {
	a = a.Unmap()
	bits := 64
	if a.Is4() {
		bits = 24
	}
	p, _ := a.Prefix(bits)
	return p
}

// StartBudget names a start's source and the budget it is charged to.
type StartBudget struct {
	Source netip.Addr
	Budget Budget
}

// overBudget reports, reading only, whether sb's source has spent its
// budget, and when a slot frees if so.
func (c *Cluster) overBudget(ctx context.Context, sb StartBudget) (over bool, retryAfter time.Duration, err error) {
	err = c.update(ctx, func(tx *txn) error {
		var ok bool
		_, ok, retryAfter, err = chargeIn(tx, c.now().UnixNano(), sb, false)
		over = !ok
		return err
	})
	if err != nil {
		return false, 0, fmt.Errorf("read budget: %w", err)
	}
	return over, retryAfter, nil
}

// chargeIn checks sb's budget at now in tx and, when write is set and the
// source is within it, charges the start (Begin, in the transaction that
// counts it). Nothing is written for a start over budget.
func chargeIn(tx *txn, now int64, sb StartBudget, write bool) (ch Charge, ok bool, retryAfter time.Duration, err error) {
	src, b := sb.Source.Unmap(), sb.Budget
	if b.Window <= 0 {
		b.Window = DefaultBudget.Window
	}
	type slot struct {
		key   string
		limit int
	}
	var slots []slot
	if b.PerAddress > 0 {
		slots = append(slots, slot{budgetKey(src.String()), b.PerAddress})
	}
	if b.PerPrefix > 0 {
		slots = append(slots, slot{budgetKey(SourcePrefix(src).String()), b.PerPrefix})
	}
	if len(slots) == 0 {
		return Charge{}, true, 0, nil
	}
	cutoff := now - int64(b.Window)
	ch, ok = Charge{at: now}, true
	entries := make([]budgetEntry, len(slots))
	for i, s := range slots {
		if _, err := tx.getJSON(s.key, &entries[i]); err != nil {
			return Charge{}, false, 0, fmt.Errorf("read budget: %w", err)
		}
		entries[i].live(cutoff)
		if n := len(entries[i].Charges); n >= s.limit {
			// nothing is written for a refused start; a slot frees
			// when the charge limit places from the newest ages out
			frees := time.Duration(entries[i].Charges[n-s.limit] - cutoff)
			ch, ok, retryAfter = Charge{}, false, max(retryAfter, frees)
		}
	}
	if !ok || !write {
		return ch, ok, retryAfter, nil
	}
	for i, s := range slots {
		entries[i].Charges = append(entries[i].Charges, now)
		tx.put(s.key, entries[i])
		ch.keys = append(ch.keys, s.key)
	}
	return ch, true, 0, nil
}

// Refund gives a proven start's charge back, if it is still inside the
// window (an older one has freed its slot already). Prove does the same in
// its own transaction when its request carries the charge.
func (c *Cluster) Refund(ctx context.Context, ch Charge) error {
	if !ch.Charged() {
		return nil
	}
	if err := c.update(ctx, func(tx *txn) error { return refundIn(tx, ch) }); err != nil {
		return fmt.Errorf("refund budget: %w", err)
	}
	return nil
}

// refundIn takes ch's charges out of their budget entries within tx.
func refundIn(tx *txn, ch Charge) error {
	for _, key := range ch.keys {
		var e budgetEntry
		found, err := tx.getJSON(key, &e)
		if err != nil {
			return fmt.Errorf("read budget: %w", err)
		}
		if !found {
			continue
		}
		i := slices.Index(e.Charges, ch.at)
		if i < 0 {
			continue
		}
		e.Charges = slices.Delete(e.Charges, i, i+1)
		tx.put(key, e)
	}
	return nil
}

// SweepBudgets deletes budget entries with no charge left inside the
// window w, so that sources seen once do not stay in the store. It deletes
// at most a few hundred per call.
func (c *Cluster) SweepBudgets(ctx context.Context, w time.Duration) error {
	if w <= 0 {
		w = DefaultBudget.Window
	}
	kvs, err := c.store.List(ctx, pfxBudget, "", 512)
	if err != nil {
		return fmt.Errorf("list budgets: %w", err)
	}
	cutoff := c.now().Add(-w).UnixNano()
	var errs []error
	for _, kv := range kvs {
		var e budgetEntry
		err := json.Unmarshal(kv.Value, &e)
		if err == nil {
			e.live(cutoff)
		}
		if err != nil || len(e.Charges) == 0 {
			if _, err := c.store.Txn(ctx, []store.Cmp{{Key: kv.Key, Rev: kv.Rev}}, []store.Op{{Key: kv.Key, Delete: true}}); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// Uncount takes back a counted attempt whose KE3 verified but which ends
// without Prove committing (a bad CSR): the holder proved the code, so it
// is no failed guess. Its lease is freed too.
func (c *Cluster) Uncount(ctx context.Context, att Attempt) error {
	if !att.Counted || att.Secret == nil {
		return nil
	}
	return c.updateSecret(ctx, att, func(_ *txn, s *Secret) bool {
		// a resumed or refunded attempt is un-counted where that happened
		if s.proven(att) && s.Unproven > 0 {
			s.Unproven--
		}
		return true
	})
}
