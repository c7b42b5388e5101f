package adminapi

import (
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"time"

	"github.com/stratumjoin/stratum/internal/cluster"
	"github.com/stratumjoin/stratum/listener/registry"
)

// The bootstrap admin's routes for API keys and the registry.

// APIKeyRequest is the body of POST /v1/admin/api-keys.
type APIKeyRequest struct {
	Tenant     string          `json:"tenant"`
	Name       string          `json:"name,omitempty"`
	Grants     []cluster.Grant `json:"grants,omitempty"`
	Scopes     []string        `json:"scopes,omitempty"`
	TTLSeconds int             `json:"ttlSeconds,omitempty"` // 0: the key does not expire
}

// APIKeyView is an API key as the admin API shows it: never its hash.
// Key, the bearer secret, is only in the response that creates it.
type APIKeyView struct {
	ID        string          `json:"id"`
	Name      string          `json:"name,omitempty"`
	Tenant    string          `json:"tenant"`
	Grants    []cluster.Grant `json:"grants"`
	Scopes    []string        `json:"scopes"`
	State     string          `json:"state"` // active, expired or revoked
	CreatedBy string          `json:"createdBy"`
	CreatedAt time.Time       `json:"createdAt"`
	ExpiresAt *time.Time      `json:"expiresAt,omitempty"`
	RevokedAt *time.Time      `json:"revokedAt,omitempty"`
	RevokedBy string          `json:"revokedBy,omitempty"`
	Key       string          `json:"key,omitempty"`
}

func toAPIKeyView(k *cluster.APIKey, now time.Time) APIKeyView {
	v := APIKeyView{
		ID: k.ID, Name: k.Name, Tenant: k.Tenant, Grants: k.Grants, Scopes: k.Scopes, State: "active",
		CreatedBy: k.CreatedBy, CreatedAt: k.CreatedAt, ExpiresAt: k.ExpiresAt, RevokedAt: k.RevokedAt, RevokedBy: k.RevokedBy,
	}
	switch {
	case k.RevokedAt != nil:
		v.State = "revoked"
	case !k.Usable(now):
		v.State = "expired"
	}
	if v.Grants == nil {
		v.Grants = []cluster.Grant{}
	}
	if v.Scopes == nil {
		v.Scopes = []string{}
	}
	return v
}

var (
	apiKeyNameRE  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._ -]{0,63}$`)
	poolPatternRE = regexp.MustCompile(`^compute-pool/([A-Za-z0-9][A-Za-z0-9._:-]{0,127}|\*)$`)
)

// MaxAPIKeyTTL bounds an expiring API key's lifetime.
const MaxAPIKeyTTL = 366 * 24 * time.Hour

func (req *APIKeyRequest) validate(reg *registry.Registry) []fieldError {
	var errs []fieldError
	if _, ok := reg.Tenant(req.Tenant); !ok {
		errs = append(errs, fieldError{path: "tenant", msg: "must be a tenant of the registry"})
	}
	if req.Name != "" && !apiKeyNameRE.MatchString(req.Name) {
		errs = append(errs, fieldError{path: "name", msg: "must match " + apiKeyNameRE.String()})
	}
	if len(req.Grants) == 0 && len(req.Scopes) == 0 {
		errs = append(errs, fieldError{path: "grants", msg: "a key needs at least one grant or scope"})
	}
	for i, g := range req.Grants {
		if !slices.Contains(Actions(), g.Action) {
			errs = append(errs, fieldError{path: fmt.Sprintf("grants[%d].action", i), msg: fmt.Sprintf("must be one of %v", Actions())})
			continue
		}
		ok := g.Resource == "*" || g.Resource == ResourceCluster
		if g.Action == ActionCreateJoinToken || g.Action == ActionReadJoinTokens || g.Action == ActionRevokeJoinToken {
			ok = g.Resource == "*" || poolPatternRE.MatchString(g.Resource)
		}
		if !ok {
			errs = append(errs, fieldError{path: fmt.Sprintf("grants[%d].resource", i), msg: "must be compute-pool/<poolId>, compute-pool/* or * for compute actions, cluster or * for ha actions"})
		}
	}
	for i, sc := range req.Scopes {
		if !slices.Contains(Scopes(), sc) {
			errs = append(errs, fieldError{path: fmt.Sprintf("scopes[%d]", i), msg: fmt.Sprintf("must be one of %v", Scopes())})
		}
	}
	if req.TTLSeconds < 0 || time.Duration(req.TTLSeconds)*time.Second > MaxAPIKeyTTL {
		errs = append(errs, fieldError{path: "ttlSeconds", msg: fmt.Sprintf("must be 0 (no expiry) to %d", int(MaxAPIKeyTTL/time.Second))})
	}
	return errs
}

func (s *Server) createAPIKey(w http.ResponseWriter, r *http.Request, p Principal) error {
	var req APIKeyRequest
	if err := decodeStrict(r.Body, &req); err != nil {
		return err
	}
	if errs := req.validate(s.core.Registry()); len(errs) > 0 {
		return errInvalid("the request has invalid fields", errs...)
	}
	id, bearer, hash, err := newAPIKey()
	if err != nil {
		return errInternal(err)
	}
	k := cluster.APIKey{ID: id, Name: req.Name, Tenant: req.Tenant, Grants: req.Grants, Scopes: req.Scopes, Hash: hash, CreatedBy: p.Name}
	if req.TTLSeconds > 0 {
		exp := s.core.Cluster().Now().UTC().Add(time.Duration(req.TTLSeconds) * time.Second)
		k.ExpiresAt = &exp
	}
	stored, err := s.core.Cluster().CreateAPIKey(r.Context(), k)
	if err != nil {
		return errInternal(err)
	}
	v := toAPIKeyView(stored, s.core.Cluster().Now())
	v.Key = bearer
	writeJSON(w, http.StatusCreated, v)
	return nil
}

func (s *Server) listAPIKeys(w http.ResponseWriter, r *http.Request, _ Principal) error {
	keys, err := s.core.Cluster().APIKeys(r.Context())
	if err != nil {
		return errInternal(err)
	}
	now := s.core.Cluster().Now()
	items := make([]APIKeyView, 0, len(keys))
	for i := range keys {
		items = append(items, toAPIKeyView(&keys[i], now))
	}
	writeJSON(w, http.StatusOK, map[string]any{"items": items})
	return nil
}

func (s *Server) revokeAPIKey(w http.ResponseWriter, r *http.Request, p Principal) error {
	k, _, err := s.core.Cluster().RevokeAPIKey(r.Context(), r.PathValue("id"), p.Name)
	if errors.Is(err, cluster.ErrNotFound) {
		return errNotFound("api key")
	}
	if err != nil {
		return errInternal(err)
	}
	writeJSON(w, http.StatusOK, toAPIKeyView(k, s.core.Cluster().Now()))
	return nil
}

func (s *Server) showRegistry(w http.ResponseWriter, _ *http.Request, _ Principal) error {
	writeJSON(w, http.StatusOK, s.core.Registry())
	return nil
}
