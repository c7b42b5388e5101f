package adminapi

import (
	"crypto/sha256"
	"errors"
	"net/http"
	"regexp"
	"time"

	"github.com/stratumjoin/stratum/internal/cluster"
	"github.com/stratumjoin/stratum/internal/joincode"
)

// The joinTokens facade (the joinTokens API, docs/api.md): single-purpose node join tokens per
// pool, created idempotently, listed by id, revoked at once.

// JoinToken is a join token's record. Token, the bearer secret, is only in
// the response of the create call that minted it.
type JoinToken struct {
	ID            string          `json:"id"`
	TenantID      string          `json:"tenantId"`
	PoolID        string          `json:"poolId"`
	Role          string          `json:"role"`
	Trust         string          `json:"trust"`
	State         string          `json:"state"` // live, used-up, expired or revoked
	MaxUses       int             `json:"maxUses"`
	Uses          int             `json:"uses"`
	Expect        *cluster.Expect `json:"expect,omitempty"`
	AllowReclaim  bool            `json:"allowReclaim"`
	Hosted        string          `json:"hosted,omitempty"`
	Endpoint      string          `json:"endpoint"`
	CAFingerprint string          `json:"caFingerprint"`
	CreatedBy     string          `json:"createdBy"`
	CreatedAt     time.Time       `json:"createdAt"`
	ExpiresAt     time.Time       `json:"expiresAt"`
	RevokedAt     *time.Time      `json:"revokedAt,omitempty"`
	RevokedBy     string          `json:"revokedBy,omitempty"`
	// FailedAttempts counts PAKE exchanges started with the token and
	// not proven. A token never burns: see docs/secrets.md.
	FailedAttempts int    `json:"failedAttempts"`
	Token          string `json:"token,omitempty"`
}

func toToken(s *cluster.Secret, now time.Time) JoinToken {
	t := JoinToken{
		ID: s.ID, TenantID: s.Tenant, PoolID: s.Pool, Role: s.Role, Trust: s.Trust, State: s.State(now),
		MaxUses: s.MaxUses, Uses: s.Uses, Expect: s.Expect, AllowReclaim: s.AllowReclaim, Hosted: s.Hosted,
		Endpoint: s.Endpoint, CAFingerprint: s.CAFingerprint, CreatedBy: s.CreatedBy, CreatedAt: s.CreatedAt, RevokedAt: s.RevokedAt,
		RevokedBy: s.RevokedBy, FailedAttempts: s.Unproven,
	}
	if s.ExpiresAt != nil {
		t.ExpiresAt = *s.ExpiresAt
	}
	return t
}

// CreateJoinTokenRequest is the body of POST /api/compute/joinTokens/create.
type CreateJoinTokenRequest struct {
	TenantID       string          `json:"tenantId"`
	PoolID         string          `json:"poolId"`
	MaxUses        *int            `json:"maxUses,omitempty"`
	TTLSeconds     *int            `json:"ttlSeconds,omitempty"`
	Expect         *cluster.Expect `json:"expect,omitempty"`
	AllowReclaim   bool            `json:"allowReclaim,omitempty"`
	Hosted         *string         `json:"hosted,omitempty"`
	IdempotencyKey string          `json:"idempotencyKey"`
}

// ListJoinTokensRequest is the body of POST /api/compute/joinTokens/list.
type ListJoinTokensRequest struct {
	TenantID        string `json:"tenantId"`
	PoolID          string `json:"poolId"`
	IncludeInactive bool   `json:"includeInactive,omitempty"`
	Limit           *int   `json:"limit,omitempty"`
	Cursor          string `json:"cursor,omitempty"`
}

// RevokeJoinTokenRequest is the body of POST /api/compute/joinTokens/revoke.
type RevokeJoinTokenRequest struct {
	TenantID string `json:"tenantId"`
	PoolID   string `json:"poolId"`
	TokenID  string `json:"tokenId"`
}

// ListJoinTokensResponse is a page of tokens; Cursor, when set, reads the
// next one.
type ListJoinTokensResponse struct {
	Items  []JoinToken `json:"items"`
	Cursor string      `json:"cursor,omitempty"`
}

// the joinTokens API's bounds and defaults.
const (
	DefaultTokenMaxUses = 1
	MaxTokenUses        = 10000
	MinTokenTTL         = 60
	MaxTokenTTL         = 86400
	DefaultTokenPage    = 100
	MaxTokenPage        = 200
)

var (
	idempotencyKeyRE = regexp.MustCompile(`^[A-Za-z0-9._~:/+=-]{1,128}$`)
	tokenIDRE        = regexp.MustCompile(`^jt_[0-9a-hjkmnp-tv-z]{26,52}$`)
)

func checkTenantPool(tenant, pool string) []fieldError {
	return append(checkString("tenantId", tenant, true, 128, tenantRE), checkString("poolId", pool, true, 128, poolRE)...)
}

func (req *CreateJoinTokenRequest) validate() []fieldError {
	errs := checkTenantPool(req.TenantID, req.PoolID)
	if req.MaxUses == nil {
		n := DefaultTokenMaxUses
		req.MaxUses = &n
	}
	if *req.MaxUses < 1 || *req.MaxUses > MaxTokenUses {
		errs = append(errs, fieldError{path: "maxUses", msg: "must be 1-10000"})
	}
	switch {
	case req.TTLSeconds == nil:
		errs = append(errs, fieldError{path: "ttlSeconds", msg: "is required"})
	case *req.TTLSeconds < MinTokenTTL || *req.TTLSeconds > MaxTokenTTL:
		errs = append(errs, fieldError{path: "ttlSeconds", msg: "must be 60-86400"})
	}
	errs = append(errs, validateExpect(req.Expect, "expect")...)
	if req.Hosted != nil && *req.Hosted != cluster.HostedKubernetes {
		errs = append(errs, fieldError{path: "hosted", msg: "must be kubernetes"})
	}
	return append(errs, checkString("idempotencyKey", req.IdempotencyKey, true, 128, idempotencyKeyRE)...)
}

func (req *ListJoinTokensRequest) validate() []fieldError {
	errs := checkTenantPool(req.TenantID, req.PoolID)
	if req.Limit == nil {
		n := DefaultTokenPage
		req.Limit = &n
	}
	if *req.Limit < 1 || *req.Limit > MaxTokenPage {
		errs = append(errs, fieldError{path: "limit", msg: "must be 1-200"})
	}
	return append(errs, checkString("cursor", req.Cursor, false, 64, tokenIDRE)...)
}

func (req *RevokeJoinTokenRequest) validate() []fieldError {
	return append(checkTenantPool(req.TenantID, req.PoolID), checkString("tokenId", req.TokenID, true, 64, tokenIDRE)...)
}

// decodeTokenRequest reads and validates one joinTokens request body.
func decodeTokenRequest(r *http.Request, req interface{ validate() []fieldError }) error {
	if err := decodeStrict(r.Body, req); err != nil {
		return err
	}
	if errs := req.validate(); len(errs) > 0 {
		return errInvalid("the request has invalid fields", errs...)
	}
	return nil
}

// tokenID derives a token's id from the tenant, the calling identity and
// the idempotency key, so that a retry lands on the stored record: jt_ and
// the lowercase Crockford base32 of SHA-256(tenant 0 caller 0 key).
func tokenID(tenant, caller, idempotencyKey string) string {
	h := sha256.New()
	h.Write([]byte(tenant))
	h.Write([]byte{0})
	h.Write([]byte(caller))
	h.Write([]byte{0})
	h.Write([]byte(idempotencyKey))
	return "jt_" + joincode.LowerBase32(h.Sum(nil))
}

func (s *Server) actForTenant(p Principal, tenant string) error {
	if !p.actsFor(tenant) {
		return errForbidden("this api key acts for tenant " + p.Tenant + " only")
	}
	return nil
}

func (s *Server) authorizePool(p Principal, action, pool string) error {
	if !p.may(action, "compute-pool/"+pool) {
		return errForbidden("needs " + action + " on compute-pool/" + pool)
	}
	return nil
}

func (s *Server) createToken(w http.ResponseWriter, r *http.Request, p Principal) error {
	var req CreateJoinTokenRequest
	if err := decodeTokenRequest(r, &req); err != nil {
		return err
	}
	if err := s.actForTenant(p, req.TenantID); err != nil {
		return err
	}
	id := tokenID(req.TenantID, p.Name, req.IdempotencyKey)
	// A retry returns the stored record, without a new authorization
	// decision and without spending a key stretching on a second mint.
	if stored, err := s.core.Cluster().Secret(r.Context(), id); err == nil {
		return s.replayToken(w, stored, &req)
	} else if !errors.Is(err, cluster.ErrNotFound) {
		return errInternal(err)
	}
	if err := s.authorizePool(p, ActionCreateJoinToken, req.PoolID); err != nil {
		return err
	}
	pool, err := s.poolOf(req.TenantID, req.PoolID)
	if err != nil {
		return err
	}
	if err := mintablePool(pool); err != nil {
		return err
	}
	hosted := ""
	if req.Hosted != nil {
		hosted = *req.Hosted
	}
	role, trust := s.core.Registry().Trust(pool, hosted)
	exp := s.core.Cluster().Now().UTC().Add(time.Duration(*req.TTLSeconds) * time.Second)
	sec := cluster.Secret{
		ID: id, Kind: cluster.KindToken, Tenant: req.TenantID, Pool: req.PoolID, Role: role, Trust: trust,
		Hosted: hosted, Expect: req.Expect, AllowReclaim: req.AllowReclaim, MaxUses: *req.MaxUses,
		CreatedBy: p.Name, ExpiresAt: &exp,
	}
	fields := map[string]any{
		"id": id, "tenantId": req.TenantID, "poolId": req.PoolID, "pinned": !req.Expect.Empty(),
		"maxUses": *req.MaxUses, "role": role, "trust": trust,
	}
	if hosted != "" {
		fields["hosted"] = hosted
	}
	stored, token, err := s.core.Mint(r.Context(), cluster.SecretSpec{Secret: sec, EventType: cluster.EventTokenCreated, EventFields: fields})
	if errors.Is(err, cluster.ErrExists) {
		// a concurrent retry stored it first: answer as a retry
		stored, err := s.core.Cluster().Secret(r.Context(), id)
		if err != nil {
			return errInternal(err)
		}
		return s.replayToken(w, stored, &req)
	}
	if err != nil {
		return errInternal(err)
	}
	out := toToken(stored, s.core.Cluster().Now())
	out.Token = token.Display()
	writeJSON(w, http.StatusOK, out)
	return nil
}

// replayToken answers a retry: the stored record without its secret, or
// CONFLICT when the retry asks for another pool, expect, allowReclaim or
// hosted than the stored token has.
func (s *Server) replayToken(w http.ResponseWriter, stored *cluster.Secret, req *CreateJoinTokenRequest) error {
	hosted := ""
	if req.Hosted != nil {
		hosted = *req.Hosted
	}
	var diff []fieldError
	if stored.Pool != req.PoolID {
		diff = append(diff, fieldError{path: "poolId", msg: "differs from the token this idempotencyKey created"})
	}
	if !expectEqual(stored.Expect, req.Expect) {
		diff = append(diff, fieldError{path: "expect", msg: "differs from the token this idempotencyKey created"})
	}
	if stored.AllowReclaim != req.AllowReclaim {
		diff = append(diff, fieldError{path: "allowReclaim", msg: "differs from the token this idempotencyKey created"})
	}
	if stored.Hosted != hosted {
		diff = append(diff, fieldError{path: "hosted", msg: "differs from the token this idempotencyKey created"})
	}
	if len(diff) > 0 {
		return &apiError{kind: kindConflict, msg: "idempotencyKey was already used for a different token", fields: diff}
	}
	writeJSON(w, http.StatusOK, toToken(stored, s.core.Cluster().Now()))
	return nil
}

func (s *Server) listTokens(w http.ResponseWriter, r *http.Request, p Principal) error {
	var req ListJoinTokensRequest
	if err := decodeTokenRequest(r, &req); err != nil {
		return err
	}
	if err := s.actForTenant(p, req.TenantID); err != nil {
		return err
	}
	if err := s.authorizePool(p, ActionReadJoinTokens, req.PoolID); err != nil {
		return err
	}
	if _, err := s.poolOf(req.TenantID, req.PoolID); err != nil {
		return err
	}
	limit := *req.Limit
	now := s.core.Cluster().Now()
	items := make([]JoinToken, 0, limit)
	after := req.Cursor
	for len(items) <= limit {
		secrets, last, err := s.core.Cluster().TokensPage(r.Context(), req.TenantID, req.PoolID, after, limit+1)
		if err != nil {
			return errInternal(err)
		}
		if last == "" {
			break
		}
		for i := range secrets {
			if req.IncludeInactive || secrets[i].Live(now) {
				items = append(items, toToken(&secrets[i], now))
			}
		}
		after = last
	}
	out := ListJoinTokensResponse{Items: items}
	if len(items) > limit {
		out.Items = items[:limit]
		out.Cursor = items[limit-1].ID
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) revokeToken(w http.ResponseWriter, r *http.Request, p Principal) error {
	var req RevokeJoinTokenRequest
	if err := decodeTokenRequest(r, &req); err != nil {
		return err
	}
	if err := s.actForTenant(p, req.TenantID); err != nil {
		return err
	}
	if err := s.authorizePool(p, ActionRevokeJoinToken, req.PoolID); err != nil {
		return err
	}
	if _, err := s.poolOf(req.TenantID, req.PoolID); err != nil {
		return err
	}
	sec, err := s.core.Cluster().Secret(r.Context(), req.TokenID)
	if errors.Is(err, cluster.ErrNotFound) || err == nil && (sec.Kind != cluster.KindToken || sec.Tenant != req.TenantID || sec.Pool != req.PoolID) {
		return errNotFound("join token " + req.TokenID)
	}
	if err != nil {
		return errInternal(err)
	}
	sec, _, err = s.core.Cluster().RevokeSecret(r.Context(), sec.ID, p.Name, cluster.EventTokenRevoked, map[string]any{"tenantId": sec.Tenant, "poolId": sec.Pool})
	if err != nil {
		return errInternal(err)
	}
	writeJSON(w, http.StatusOK, toToken(sec, s.core.Cluster().Now()))
	return nil
}
