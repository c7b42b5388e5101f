package cluster

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Grant allows one action on the resources a pattern names: an exact
// resource ("compute-pool/pool-a", "cluster"), every resource of a type
// ("compute-pool/*"), or every resource ("*").
type Grant struct {
	Action   string `json:"action"`
	Resource string `json:"resource"`
}

// Allows reports whether the grant covers action on resource.
func (g Grant) Allows(action, resource string) bool {
	if g.Action != action {
		return false
	}
	switch {
	case g.Resource == "*" || g.Resource == resource:
		return true
	case strings.HasSuffix(g.Resource, "/*"):
		rest, ok := strings.CutPrefix(resource, strings.TrimSuffix(g.Resource, "*"))
		return ok && rest != ""
	}
	return false
}

// APIKey is a bearer key of the admin API's HTTPS listener, bound to one
// tenant and to its grants (joinTokens and join-codes actions) and scopes
// (the join-keys API, docs/api.md). Only the SHA-256 of its secret is stored.
type APIKey struct {
	ID        string     `json:"id"`
	Name      string     `json:"name,omitempty"`
	Tenant    string     `json:"tenant"`
	Grants    []Grant    `json:"grants,omitempty"`
	Scopes    []string   `json:"scopes,omitempty"`
	Hash      string     `json:"hash"` // hex SHA-256 of the secret part
	CreatedBy string     `json:"createdBy"`
	CreatedAt time.Time  `json:"createdAt"`
	ExpiresAt *time.Time `json:"expiresAt,omitempty"`
	RevokedAt *time.Time `json:"revokedAt,omitempty"`
	RevokedBy string     `json:"revokedBy,omitempty"`
}

// Usable reports whether the key may still authenticate at now.
func (k *APIKey) Usable(now time.Time) bool {
	return k.RevokedAt == nil && (k.ExpiresAt == nil || now.Before(*k.ExpiresAt))
}

// API key event types.
const (
	EventAPIKeyCreated = "security.api-key.created"
	EventAPIKeyRevoked = "security.api-key.revoked"
)

// CreateAPIKey stores a new API key; ErrExists when its id is taken.
func (c *Cluster) CreateAPIKey(ctx context.Context, k APIKey) (*APIKey, error) {
	k.CreatedAt = c.now().UTC()
	err := c.update(ctx, func(tx *txn) error {
		if _, found, err := tx.getString(apiKeyKey(k.ID)); err != nil {
			return err
		} else if found {
			return ErrExists
		}
		tx.put(apiKeyKey(k.ID), k)
		tx.event(EventAPIKeyCreated, k.CreatedBy, map[string]any{"id": k.ID, "tenant": k.Tenant, "name": k.Name})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("store api key: %w", err)
	}
	return &k, nil
}

// APIKey returns one API key record.
func (c *Cluster) APIKey(ctx context.Context, id string) (*APIKey, error) {
	var k APIKey
	found, err := getJSON(ctx, c.store, apiKeyKey(id), &k)
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, ErrNotFound
	}
	return &k, nil
}

// APIKeys lists API key records in id order.
func (c *Cluster) APIKeys(ctx context.Context) ([]APIKey, error) {
	return listJSON[APIKey](ctx, c.store, pfxAPIKey, "", 0)
}

// RevokeAPIKey revokes a key at once; it reports whether this call did.
func (c *Cluster) RevokeAPIKey(ctx context.Context, id, actor string) (*APIKey, bool, error) {
	var k APIKey
	var did bool
	err := c.update(ctx, func(tx *txn) error {
		k, did = APIKey{}, false
		found, err := tx.getJSON(apiKeyKey(id), &k)
		if err != nil {
			return err
		}
		if !found {
			return ErrNotFound
		}
		if k.RevokedAt != nil {
			return nil
		}
		now := c.now().UTC()
		k.RevokedAt, k.RevokedBy = &now, actor
		tx.put(apiKeyKey(id), k)
		tx.event(EventAPIKeyRevoked, actor, map[string]any{"id": id, "tenant": k.Tenant})
		did = true
		return nil
	})
	if err != nil {
		return nil, false, fmt.Errorf("revoke api key: %w", err)
	}
	return &k, did, nil
}

// TokensPage lists up to limit joinTokens of a pool in id order, after the
// id `after` ("" = from the start). It also returns the id of the last
// listing entry read, so a caller filtering the page can go on from there.
func (c *Cluster) TokensPage(ctx context.Context, tenant, pool, after string, limit int) ([]Secret, string, error) {
	return c.indexedSecrets(ctx, tokenIndexPrefix(tenant, pool), after, limit)
}

// KeysPage lists up to limit join keys of an organization in id order,
// after the id `after`, as TokensPage does.
func (c *Cluster) KeysPage(ctx context.Context, org, after string, limit int) ([]Secret, string, error) {
	return c.indexedSecrets(ctx, keyIndexPrefix(org), after, limit)
}

// indexedSecrets lists up to limit secrets that the index keys under
// prefix point at, in key order, starting after prefix+after. Index keys
// whose secret is gone are skipped.
func (c *Cluster) indexedSecrets(ctx context.Context, prefix, after string, limit int) (secrets []Secret, last string, err error) {
	from := ""
	if after != "" {
		from = prefix + after
	}
	kvs, err := c.store.List(ctx, prefix, from, limit)
	if err != nil {
		return nil, "", fmt.Errorf("list %s: %w", prefix, err)
	}
	for _, kv := range kvs {
		last = strings.TrimPrefix(kv.Key, prefix)
		s, err := c.Secret(ctx, string(kv.Value))
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, "", err
		}
		secrets = append(secrets, *s)
	}
	return secrets, last, nil
}
