package cluster

import (
	"context"
	"errors"
	"fmt"

	"github.com/stratumjoin/stratum/internal/store"
)

// What the listeners of one cluster share (docs/cluster.md): the sealed
// identity record and the endpoints agents may dial.

// SharedIdentity returns the sealed identity record and its revision; rev
// is 0 when the store holds no cluster identity.
func (c *Cluster) SharedIdentity(ctx context.Context) (record []byte, rev int64, err error) {
	kv, err := c.store.Get(ctx, keySharedIdentity)
	if err != nil {
		return nil, 0, fmt.Errorf("read cluster identity: %w", err)
	}
	return kv.Value, kv.Rev, nil
}

var errIdentityMoved = errors.New("cluster identity moved")

// PutSharedIdentity replaces the sealed identity record if it is still at
// rev (0: create it), with an event of eventType when given, in the same
// transaction. It reports whether it did.
func (c *Cluster) PutSharedIdentity(ctx context.Context, record []byte, rev int64, eventType, actor string, fields map[string]any) (bool, error) {
	err := c.update(ctx, func(tx *txn) error {
		kv, err := tx.get(keySharedIdentity)
		if err != nil {
			return err
		}
		if kv.Rev != rev {
			return errIdentityMoved
		}
		tx.op(store.Op{Key: keySharedIdentity, Value: record})
		if eventType != "" {
			tx.event(eventType, actor, fields)
		}
		return nil
	})
	switch {
	case errors.Is(err, errIdentityMoved):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("write cluster identity: %w", err)
	}
	return true, nil
}

// WatchSharedIdentity watches the identity record. ok is false when the
// store cannot watch.
func (c *Cluster) WatchSharedIdentity(ctx context.Context) (ch <-chan struct{}, ok bool, err error) {
	w, ok := c.store.(store.Watcher)
	if !ok {
		return nil, false, nil
	}
	ch, err = w.Watch(ctx, keySharedIdentity)
	return ch, true, err
}

// AddEndpoints records endpoints agents may dial; those listed already are
// left alone.
func (c *Cluster) AddEndpoints(ctx context.Context, endpoints []string) error {
	for _, ep := range endpoints {
		err := c.update(ctx, func(tx *txn) error {
			if _, found, err := tx.getString(endpointKey(ep)); err != nil || found {
				return err
			}
			tx.putString(endpointKey(ep), ep)
			return nil
		})
		if err != nil {
			return fmt.Errorf("record endpoint %s: %w", ep, err)
		}
	}
	return nil
}

// Endpoints lists every endpoint the cluster's listeners recorded, in order.
func (c *Cluster) Endpoints(ctx context.Context) ([]string, error) {
	kvs, err := c.store.List(ctx, pfxEndpoint, "", 0)
	if err != nil {
		return nil, fmt.Errorf("list endpoints: %w", err)
	}
	out := make([]string, 0, len(kvs))
	for _, kv := range kvs {
		out = append(out, string(kv.Value))
	}
	return out, nil
}
