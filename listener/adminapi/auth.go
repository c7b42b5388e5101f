package adminapi

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"time"

	"golang.org/x/time/rate"

	"github.com/stratumjoin/stratum/internal/cluster"
	"github.com/stratumjoin/stratum/internal/joincode"
	"github.com/stratumjoin/stratum/listener/registry"
)

// An API key reads sjk_<id>_<secret>: the id (16 lowercase Crockford
// base32 symbols, 80 bits) picks the record, the secret (52 symbols, 256
// bits) is checked against its stored SHA-256 in constant time.
const apiKeyPrefix = "sjk_"

var apiKeyRE = regexp.MustCompile(`^sjk_([0-9a-hjkmnp-tv-z]{16})_([0-9a-hjkmnp-tv-z]{52})$`)

// newAPIKey returns a fresh key's id, its whole bearer string and the hash
// that is stored.
func newAPIKey() (id, bearer, hash string, err error) {
	idb := make([]byte, 10)
	sec := make([]byte, 32)
	if _, err := rand.Read(idb); err != nil {
		return "", "", "", fmt.Errorf("read random: %w", err)
	}
	if _, err := rand.Read(sec); err != nil {
		return "", "", "", fmt.Errorf("read random: %w", err)
	}
	id = joincode.LowerBase32(idb)
	secret := joincode.LowerBase32(sec)
	return id, apiKeyPrefix + id + "_" + secret, hashAPISecret(secret), nil
}

func hashAPISecret(secret string) string {
	h := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(h[:])
}

// authenticate returns the caller: the principal the transport set (the
// unix socket's peer credentials), else the bearer API key's. Any failure
// is the same 401, whatever its reason.
func (s *Server) authenticate(r *http.Request) (Principal, error) {
	if p, ok := principalOf(r); ok {
		return p, nil
	}
	unauthorized := &apiError{kind: kindUnauthenticated, msg: "unauthorized"}
	scheme, bearer, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return Principal{}, unauthorized
	}
	m := apiKeyRE.FindStringSubmatch(strings.TrimSpace(bearer))
	if m == nil {
		return Principal{}, unauthorized
	}
	k, err := s.core.Cluster().APIKey(r.Context(), m[1])
	if errors.Is(err, cluster.ErrNotFound) {
		return Principal{}, unauthorized
	}
	if err != nil {
		return Principal{}, errInternal(err)
	}
	want, err := hex.DecodeString(k.Hash)
	got := sha256.Sum256([]byte(m[2]))
	if err != nil || subtle.ConstantTimeCompare(want, got[:]) != 1 || !k.Usable(s.core.Cluster().Now()) {
		return Principal{}, unauthorized
	}
	return Principal{Name: "apikey:" + k.ID, Tenant: k.Tenant, Grants: k.Grants, Scopes: k.Scopes}, nil
}

// organization is the join-keys organization a caller acts in: its API
// key's tenant, or for the bootstrap admin the registry's default tenant.
func (s *Server) organization(p Principal) (registry.Tenant, error) {
	reg := s.core.Registry()
	if !p.Admin {
		if t, ok := reg.Tenant(p.Tenant); ok {
			return t, nil
		}
		return registry.Tenant{}, &apiError{kind: kindForbidden, msg: "the api key's organization is not in the registry"}
	}
	t, ok := reg.DefaultTenant()
	if !ok {
		return registry.Tenant{}, &apiError{kind: kindForbidden, msg: "the registry defines no organization"}
	}
	return t, nil
}

// allowRequest spends one token of the organization's rate limit.
func (s *Server) allowRequest(org registry.Tenant) (bool, time.Duration) {
	s.limitersMu.Lock()
	l := s.limiters[org.ID]
	if l == nil {
		l = rate.NewLimiter(rate.Limit(org.Limits.RequestsPerSecond), org.Limits.Burst)
		s.limiters[org.ID] = l
	}
	s.limitersMu.Unlock()
	res := l.Reserve()
	if !res.OK() {
		return false, time.Second
	}
	if d := res.Delay(); d > 0 {
		res.Cancel()
		return false, d
	}
	return true, 0
}
