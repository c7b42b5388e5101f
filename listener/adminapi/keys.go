package adminapi

import (
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"time"
	"unicode"

	"github.com/stratumjoin/stratum/internal/cluster"
	"github.com/stratumjoin/stratum/internal/joincode"
	"github.com/stratumjoin/stratum/listener/registry"
)

// The join-keys facade (the join-keys API, docs/api.md): reusable enrollment keys of an
// organization's overlay network. Every host that enrolls with a key joins
// as a new host with the key's network, role and tags, an address from
// each of its prefixes, and its own hostname (or the key's name and a
// random suffix).

// JoinKey is a join key as the join-keys API returns it. Token is only in the
// response that creates the key.
type JoinKey struct {
	ID              string     `json:"id"`
	OrganizationID  string     `json:"organizationID"`
	Name            string     `json:"name"`
	NetworkID       string     `json:"networkID"`
	RoleID          *string    `json:"roleID"`
	Tags            []string   `json:"tags"`
	AutoAssignCIDRs []string   `json:"autoAssignCIDRs"`
	ExpiresAt       *time.Time `json:"expiresAt"`
	CreatedAt       time.Time  `json:"createdAt"`
	ModifiedAt      time.Time  `json:"modifiedAt"`
	// FailedAttempts counts PAKE exchanges started with the key and not
	// proven. A key never burns: see docs/secrets.md.
	FailedAttempts int `json:"failedAttempts"`
	// RevokedAt and RevokedBy are set when a CA retirement ended the key.
	RevokedAt *time.Time `json:"revokedAt,omitempty"`
	RevokedBy string     `json:"revokedBy,omitempty"`
	Token     string     `json:"token,omitempty"`
}

func toKey(s *cluster.Secret) JoinKey {
	k := JoinKey{
		ID: s.ID, OrganizationID: s.Key.OrgID, Name: s.Key.Name, NetworkID: s.Key.NetworkID,
		Tags: s.Key.Tags, AutoAssignCIDRs: s.Key.CIDRs, ExpiresAt: s.ExpiresAt, CreatedAt: s.CreatedAt, ModifiedAt: s.ModifiedAt,
		FailedAttempts: s.Unproven, RevokedAt: s.RevokedAt, RevokedBy: s.RevokedBy,
	}
	if s.Key.RoleID != "" {
		role := s.Key.RoleID
		k.RoleID = &role
	}
	if k.Tags == nil {
		k.Tags = []string{}
	}
	if len(k.AutoAssignCIDRs) == 0 {
		k.AutoAssignCIDRs = nil
	}
	return k
}

// CreateJoinKeyRequest is the body of POST /v1/join-keys.
type CreateJoinKeyRequest struct {
	Name            string   `json:"name"`
	NetworkID       string   `json:"networkID"`
	RoleID          *string  `json:"roleID,omitempty"`
	Tags            []string `json:"tags,omitempty"`
	AutoAssignCIDRs []string `json:"autoAssignCIDRs,omitempty"`
	ExpiresAt       *string  `json:"expiresAt,omitempty"`
}

// the join-keys API's bounds, and ours where it sets none (tags).
const (
	MaxKeyNameLen   = 54
	MaxKeyCIDRs     = 2
	MaxKeyTags      = 64
	MaxKeyTagLen    = 128
	DefaultKeysPage = 25
	MaxKeysPage     = 500
)

var keyNameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]*[a-z0-9])?$`)

// checked is a validated create request, resolved against the registry.
type checkedKey struct {
	network   registry.Network
	roleID    string
	tags      []string
	cidrs     []string
	expiresAt *time.Time
}

func (req *CreateJoinKeyRequest) validate(reg *registry.Registry, org string, now time.Time) (checkedKey, []fieldError) {
	var c checkedKey
	var errs []fieldError
	switch {
	case req.Name == "":
		errs = append(errs, fieldError{path: "name", msg: "is required", code: keyErrMissingValue})
	case len(req.Name) > MaxKeyNameLen:
		errs = append(errs, fieldError{path: "name", msg: fmt.Sprintf("must be at most %d characters", MaxKeyNameLen)})
	case !keyNameRE.MatchString(req.Name):
		errs = append(errs, fieldError{path: "name", msg: "must be a DNS label: lowercase letters, digits and hyphens, not starting or ending with a hyphen"})
	}
	network, ok := reg.Network(req.NetworkID)
	switch {
	case req.NetworkID == "":
		errs = append(errs, fieldError{path: "networkID", msg: "is required", code: keyErrMissingValue})
	case !ok || network.Tenant != org:
		errs = append(errs, fieldError{path: "networkID", msg: "no such network in this organization", code: keyErrInvalidReference})
	default:
		c.network = network
	}
	if req.RoleID != nil {
		role, ok := reg.Role(*req.RoleID)
		if !ok || role.Tenant != org {
			errs = append(errs, fieldError{path: "roleID", msg: "no such role in this organization", code: keyErrInvalidReference})
		}
		c.roleID = *req.RoleID
	}
	if len(req.Tags) > MaxKeyTags {
		errs = append(errs, fieldError{path: "tags", msg: fmt.Sprintf("must have at most %d items", MaxKeyTags)})
	}
	for i, t := range req.Tags {
		if t == "" || len(t) > MaxKeyTagLen || !printable(t) {
			errs = append(errs, fieldError{path: fmt.Sprintf("tags[%d]", i), msg: fmt.Sprintf("must be 1-%d printable characters", MaxKeyTagLen)})
		}
	}
	c.tags = req.Tags
	if len(req.AutoAssignCIDRs) > MaxKeyCIDRs {
		errs = append(errs, fieldError{path: "autoAssignCIDRs", msg: fmt.Sprintf("must have at most %d items", MaxKeyCIDRs)})
	} else if c.network.ID != "" {
		seen := map[string]bool{}
		for i, p := range req.AutoAssignCIDRs {
			switch {
			case p != c.network.CIDR && (c.network.IPv6Prefix == "" || p != c.network.IPv6Prefix):
				want := c.network.CIDR
				if c.network.IPv6Prefix != "" {
					want += " or " + c.network.IPv6Prefix
				}
				errs = append(errs, fieldError{path: fmt.Sprintf("autoAssignCIDRs[%d]", i), msg: "must be exactly the network's IPv4 CIDR or IPv6 prefix: " + want})
			case seen[p]:
				errs = append(errs, fieldError{path: fmt.Sprintf("autoAssignCIDRs[%d]", i), msg: "is listed twice"})
			}
			seen[p] = true
			c.cidrs = append(c.cidrs, p)
		}
		// the network's IPv6 prefix is always included
		if v6 := c.network.IPv6Prefix; v6 != "" && !seen[v6] {
			c.cidrs = append(c.cidrs, v6)
		}
	}
	if req.ExpiresAt != nil {
		t, err := time.Parse(time.RFC3339, *req.ExpiresAt)
		switch {
		case err != nil:
			errs = append(errs, fieldError{path: "expiresAt", msg: "must be an RFC 3339 date-time"})
		case !t.After(now):
			errs = append(errs, fieldError{path: "expiresAt", msg: "must be in the future"})
		default:
			t = t.UTC()
			c.expiresAt = &t
		}
	}
	return c, errs
}

func printable(s string) bool {
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}

func (s *Server) createKey(w http.ResponseWriter, r *http.Request, p Principal) error {
	org, err := s.organization(p)
	if err != nil {
		return err
	}
	var req CreateJoinKeyRequest
	if err := decodeStrict(r.Body, &req); err != nil {
		return err
	}
	c, errs := req.validate(s.core.Registry(), org.ID, s.core.Cluster().Now())
	if len(errs) > 0 {
		return errInvalid("the request has invalid fields", errs...)
	}
	id, err := joincode.NewKeyID()
	if err != nil {
		return errInternal(err)
	}
	sec := cluster.Secret{
		ID: id, Kind: cluster.KindKey, Tenant: org.ID, Pool: "network/" + c.network.ID,
		// a tenant's key enrolls the tenant's machines: never platform trust
		Role: cluster.RoleNodeTenant, Trust: cluster.TrustTenantOwned,
		CreatedBy: p.Name, ExpiresAt: c.expiresAt,
		Key: &cluster.KeyAttrs{Name: req.Name, OrgID: org.ID, NetworkID: c.network.ID, RoleID: c.roleID, Tags: c.tags, CIDRs: c.cidrs},
	}
	spec := cluster.SecretSpec{
		Secret: sec, EventType: cluster.EventKeyCreated,
		EventFields: map[string]any{"id": id, "organizationID": org.ID, "name": req.Name, "networkID": c.network.ID},
		PerOrgLimit: org.Limits.JoinKeys,
	}
	stored, token, err := s.core.Mint(r.Context(), spec)
	switch {
	case errors.Is(err, cluster.ErrNameTaken):
		return &apiError{kind: kindDuplicate, msg: "value already exists", fields: []fieldError{{path: "name", msg: "value already exists", code: KeyErrDuplicateValue}}}
	case errors.Is(err, cluster.ErrQuotaExceeded):
		return &apiError{kind: kindLimit, msg: fmt.Sprintf("the organization has reached its limit of %d join keys", org.Limits.JoinKeys), limit: org.Limits.JoinKeys, limitName: "joinKeys"}
	case err != nil:
		return errInternal(err)
	}
	out := toKey(stored)
	out.Token = token.Display()
	writeJSON(w, http.StatusOK, map[string]JoinKey{"data": out})
	return nil
}

// KeysPage is the join-keys API's list response: {"data": [...], "metadata": {...}}.
type KeysPage struct {
	Data     []JoinKey    `json:"data"`
	Metadata PageMetadata `json:"metadata"`
}

// PageMetadata says whether another page follows and how to read it.
type PageMetadata struct {
	HasNextPage bool   `json:"hasNextPage"`
	NextCursor  string `json:"nextCursor,omitempty"`
}

var keyIDRE = regexp.MustCompile(`^dnjoin-[A-Z2-7]{26}$`)

func (s *Server) listKeys(w http.ResponseWriter, r *http.Request, p Principal) error {
	org, err := s.organization(p)
	if err != nil {
		return err
	}
	q := r.URL.Query()
	var errs []fieldError
	size := DefaultKeysPage
	if v := q.Get("pageSize"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > MaxKeysPage {
			errs = append(errs, fieldError{path: "pageSize", msg: fmt.Sprintf("must be an integer 1-%d", MaxKeysPage)})
		}
		size = n
	}
	cursor := q.Get("cursor")
	if cursor != "" && !keyIDRE.MatchString(cursor) {
		errs = append(errs, fieldError{path: "cursor", msg: "must be a cursor this API returned"})
	}
	for name := range q {
		if name != "pageSize" && name != "cursor" {
			errs = append(errs, fieldError{path: name, msg: "is not a parameter of this request"})
		}
	}
	if len(errs) > 0 {
		return &apiError{kind: kindInvalid, msg: "invalid query parameters", fields: errs, param: "query"}
	}
	secrets, _, err := s.core.Cluster().KeysPage(r.Context(), org.ID, cursor, size+1)
	if err != nil {
		return errInternal(err)
	}
	page := KeysPage{Data: make([]JoinKey, 0, len(secrets))}
	for i := range secrets {
		if secrets[i].Key != nil {
			page.Data = append(page.Data, toKey(&secrets[i]))
		}
	}
	if len(page.Data) > size {
		page.Data = page.Data[:size]
		page.Metadata = PageMetadata{HasNextPage: true, NextCursor: page.Data[size-1].ID}
	}
	writeJSON(w, http.StatusOK, page)
	return nil
}

// keyFor loads a join key of the caller's organization; any other is not
// found.
func (s *Server) keyFor(r *http.Request, p Principal) (*cluster.Secret, registry.Tenant, error) {
	org, err := s.organization(p)
	if err != nil {
		return nil, org, err
	}
	sec, err := s.core.Cluster().Secret(r.Context(), r.PathValue("id"))
	if errors.Is(err, cluster.ErrNotFound) || err == nil && (sec.Kind != cluster.KindKey || sec.Key == nil || sec.Key.OrgID != org.ID) {
		return nil, org, errNotFound("join key")
	}
	if err != nil {
		return nil, org, errInternal(err)
	}
	return sec, org, nil
}

func (s *Server) getKey(w http.ResponseWriter, r *http.Request, p Principal) error {
	sec, _, err := s.keyFor(r, p)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]JoinKey{"data": toKey(sec)})
	return nil
}

func (s *Server) deleteKey(w http.ResponseWriter, r *http.Request, p Principal) error {
	sec, _, err := s.keyFor(r, p)
	if err != nil {
		return err
	}
	err = s.core.Cluster().DeleteSecret(r.Context(), sec.ID, p.Name, cluster.EventKeyDeleted)
	if errors.Is(err, cluster.ErrNotFound) {
		return errNotFound("join key")
	}
	if err != nil {
		return errInternal(err)
	}
	writeJSON(w, http.StatusOK, map[string]any{"data": map[string]any{}})
	return nil
}
