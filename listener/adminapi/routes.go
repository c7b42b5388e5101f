package adminapi

import (
	"errors"
	"net/http"
	"sort"
	"time"
)

// facade names which seed's error shape a route answers in.
type facade int

const (
	facadeCluster facade = iota // the join-codes API: application/problem+json
	facadeTokens                // the joinTokens API: {"error":{...}}
	facadeKeys                  // the join-keys API: {"errors":[...]}
)

// facadeFor picks the error shape of a path, also for paths no route
// serves.
func facadeFor(path string) facade {
	switch {
	case hasPathPrefix(path, "/api/compute"):
		return facadeTokens
	case hasPathPrefix(path, "/v1/join-keys"):
		return facadeKeys
	}
	return facadeCluster
}

func hasPathPrefix(path, prefix string) bool {
	return path == prefix || len(path) > len(prefix) && path[:len(prefix)] == prefix && path[len(prefix)] == '/'
}

// handlerFunc serves one route for an authenticated caller; an error is
// written in the route's facade shape by Server.fail.
type handlerFunc func(w http.ResponseWriter, r *http.Request, p Principal) error

type route struct {
	method string
	path   string
	facade facade
	// adminOnly routes belong to the bootstrap admin alone.
	adminOnly bool
	// scope, on a join-keys route, is the API key scope it needs; the
	// organization's rate limit applies first.
	scope string
	h     handlerFunc
}

// Seed-004 style actions of the join-codes routes, decided on "cluster".
const (
	ActionDescribeJoinCodes = "ha:DescribeJoinCodes"
	ActionCreateJoinCode    = "ha:CreateJoinCode"
	ActionRevokeJoinCode    = "ha:RevokeJoinCode"
	// The approval of joins made with join codes, in the same family.
	ActionDescribeNodeJoins = "ha:DescribeNodeJoins"
	ActionApproveNodeJoin   = "ha:ApproveNodeJoin"
	ActionRefuseNodeJoin    = "ha:RefuseNodeJoin"
	// ResourceCluster is the resource the join-codes actions are decided on.
	ResourceCluster = "cluster"
)

// Seed-000 actions, decided on compute-pool/{poolId}.
const (
	ActionCreateJoinToken = "compute:join-tokens:create"
	ActionReadJoinTokens  = "compute:join-tokens:read"
	ActionRevokeJoinToken = "compute:join-tokens:revoke"
)

// Seed-003 scopes.
const (
	ScopeCreateJoinKey = "join-keys:create"
	ScopeListJoinKeys  = "join-keys:list"
	ScopeReadJoinKey   = "join-keys:read"
	ScopeDeleteJoinKey = "join-keys:delete"
)

// Actions lists every action an API key may be granted.
func Actions() []string {
	return []string{ActionCreateJoinToken, ActionReadJoinTokens, ActionRevokeJoinToken, ActionDescribeJoinCodes, ActionCreateJoinCode, ActionRevokeJoinCode, ActionDescribeNodeJoins, ActionApproveNodeJoin, ActionRefuseNodeJoin}
}

// Scopes lists every scope an API key may hold.
func Scopes() []string {
	return []string{ScopeCreateJoinKey, ScopeListJoinKeys, ScopeReadJoinKey, ScopeDeleteJoinKey}
}

func (s *Server) routeTable() []route {
	return []route{
		// the joinTokens API: joinTokens
		{method: http.MethodPost, path: "/api/compute/joinTokens/create", facade: facadeTokens, h: s.createToken},
		{method: http.MethodPost, path: "/api/compute/joinTokens/list", facade: facadeTokens, h: s.listTokens},
		{method: http.MethodPost, path: "/api/compute/joinTokens/revoke", facade: facadeTokens, h: s.revokeToken},

		// the join-keys API: join keys
		{method: http.MethodPost, path: "/v1/join-keys", facade: facadeKeys, scope: ScopeCreateJoinKey, h: s.createKey},
		{method: http.MethodGet, path: "/v1/join-keys", facade: facadeKeys, scope: ScopeListJoinKeys, h: s.listKeys},
		{method: http.MethodGet, path: "/v1/join-keys/{id}", facade: facadeKeys, scope: ScopeReadJoinKey, h: s.getKey},
		{method: http.MethodDelete, path: "/v1/join-keys/{id}", facade: facadeKeys, scope: ScopeDeleteJoinKey, h: s.deleteKey},

		// the join-codes API: join codes
		{method: http.MethodGet, path: "/v1/admin/cluster/join-codes", h: s.listCodes},
		{method: http.MethodPost, path: "/v1/admin/cluster/join-codes", h: s.mintCode},
		{method: http.MethodGet, path: "/v1/admin/cluster/join-codes/{id}", h: s.getCode},
		{method: http.MethodPost, path: "/v1/admin/cluster/join-codes/{id}/revoke", h: s.revokeCode},
		{method: http.MethodPost, path: "/v1/admin/cluster/join-codes/{id}/reset-attempts", h: s.resetAttempts},

		// the bootstrap admin's cluster routes, in the join-codes API's style
		{method: http.MethodGet, path: "/v1/admin/cluster/nodes", adminOnly: true, h: s.listNodes},
		{method: http.MethodGet, path: "/v1/admin/cluster/nodes/{id}", adminOnly: true, h: s.getNode},
		{method: http.MethodPost, path: "/v1/admin/cluster/nodes/{id}/revoke", adminOnly: true, h: s.revokeNode},
		// the approval of joins, in the join-codes API's style, for API keys too
		{method: http.MethodGet, path: "/v1/admin/cluster/joins", h: s.listJoins},
		{method: http.MethodGet, path: "/v1/admin/cluster/joins/{id}", h: s.getJoin},
		{method: http.MethodPost, path: "/v1/admin/cluster/joins/{id}/approve", h: s.decideJoin(true)},
		{method: http.MethodPost, path: "/v1/admin/cluster/joins/{id}/refuse", h: s.decideJoin(false)},
		{method: http.MethodGet, path: "/v1/admin/cluster/ca", adminOnly: true, h: s.getCA},
		{method: http.MethodPost, path: "/v1/admin/cluster/ca/rotate", adminOnly: true, h: s.rotateCA},
		{method: http.MethodPost, path: "/v1/admin/cluster/ca/retire", adminOnly: true, h: s.retireCA},
		{method: http.MethodGet, path: "/v1/admin/cluster/events", adminOnly: true, h: s.listEvents},
		{method: http.MethodGet, path: "/v1/admin/cluster/store/backup", adminOnly: true, h: s.backupStore},
		{method: http.MethodGet, path: "/v1/admin/registry", adminOnly: true, h: s.showRegistry},
		{method: http.MethodPost, path: "/v1/admin/api-keys", adminOnly: true, h: s.createAPIKey},
		{method: http.MethodGet, path: "/v1/admin/api-keys", adminOnly: true, h: s.listAPIKeys},
		{method: http.MethodPost, path: "/v1/admin/api-keys/{id}/revoke", adminOnly: true, h: s.revokeAPIKey},
	}
}

// Routes lists every route the server serves as "METHOD /path", sorted;
// api/openapi.yaml documents exactly these.
func Routes() []string {
	var out []string
	for _, rt := range (&Server{}).routeTable() {
		out = append(out, rt.method+" "+rt.path)
	}
	sort.Strings(out)
	return out
}

// handle authenticates the caller, applies the route's gate and writes a
// failure in the route's facade shape.
func (s *Server) handle(rt route) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, viaSocket := principalOf(r)
		now := time.Now()
		if !viaSocket {
			if wait, blocked := s.authFails.blocked(sourceOf(r), now); blocked {
				s.fail(w, r, rt.facade, errTooManyFailures(wait))
				return
			}
		}
		p, err := s.authenticate(r)
		var ae *apiError
		if !viaSocket && errors.As(err, &ae) && ae.kind == kindUnauthenticated {
			s.authFails.failed(sourceOf(r), now)
		}
		if err == nil {
			err = s.gate(rt, p)
		}
		if err == nil {
			if e := jsonBody(r); e != nil {
				err = e
			}
		}
		if err == nil {
			err = rt.h(w, r, p)
		}
		if err != nil {
			s.fail(w, r, rt.facade, err)
		}
	})
}

func (s *Server) gate(rt route, p Principal) error {
	switch {
	case rt.adminOnly && !p.Admin:
		return errForbidden("this action needs the bootstrap admin")
	case rt.scope != "":
		org, err := s.organization(p)
		if err != nil {
			return err
		}
		if ok, wait := s.allowRequest(org); !ok {
			return &apiError{kind: kindRateLimited, msg: "too many requests", retryAfter: wait}
		}
		if !p.hasScope(rt.scope) {
			return &apiError{kind: kindForbidden, msg: "api key must support the following scopes: " + rt.scope}
		}
	}
	return nil
}
