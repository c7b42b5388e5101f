package cluster

import (
	"context"
	"fmt"

	"github.com/stratumjoin/stratum/internal/store"
)

// Keys of what the listeners of one cluster share (docs/cluster.md).
const (
	// keySharedIdentity holds the cluster's keys sealed under the
	// key-encryption key (package keyseal): never a key in clear.
	keySharedIdentity = "cluster/identity"
	// pfxEndpoint lists the endpoints agents may dial: cluster/endpoint/<host:port>.
	pfxEndpoint = "cluster/endpoint/"
)

// SharedIdentity returns the sealed identity record and its revision; rev
// is 0 when the store holds no cluster identity.
func (c *Cluster) SharedIdentity(ctx context.Context) (record []byte, rev int64, err error) {
	kv, err := c.store.Get(ctx, keySharedIdentity)
	if err != nil {
		return nil, 0, fmt.Errorf("read cluster identity: %w", err)
	}
	return kv.Value, kv.Rev, nil
}

// PutSharedIdentity replaces the sealed identity record if it is still at
// rev (0: create it), and records ev when given. It reports whether it did.
func (c *Cluster) PutSharedIdentity(ctx context.Context, record []byte, rev int64, eventType, actor string, fields map[string]string) (bool, error) {
	ops := []store.Op{{Key: keySharedIdentity, Value: record}}
	var ev *Event
	if eventType != "" {
		e, op := c.newEvent(eventType, actor, fields)
		ev, ops = &e, append(ops, op)
	}
	ok, err := c.store.Txn(ctx, []store.Cmp{{Key: keySharedIdentity, Rev: rev}}, ops)
	if err != nil {
		return false, fmt.Errorf("write cluster identity: %w", err)
	}
	if ok && ev != nil {
		c.logEvents(*ev)
	}
	return ok, nil
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
		if _, err := c.store.Txn(ctx, []store.Cmp{{Key: pfxEndpoint + ep}}, []store.Op{putString(pfxEndpoint+ep, ep)}); err != nil {
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
