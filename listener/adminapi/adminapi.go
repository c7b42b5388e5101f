// Package adminapi is the listener's admin API: one core (package cluster
// for codes, tokens, keys, nodes, events and API keys; package registry for
// tenants, sites, pools, networks and roles) behind three thin facades, each
// exactly as its seed document describes it, error shape included:
//
//	the joinTokens API  POST /api/compute/joinTokens/{create,list,revoke}   {"error":{code,message,details}}
//	the join-keys API  /v1/join-keys (create, list, get, delete)            {"errors":[{code,message,path}]}
//	the join-codes API  /v1/admin/cluster/join-codes (list, mint, revoke)    application/problem+json
//
// plus the bootstrap admin's own routes (nodes, joins, CA, events, API
// keys, registry) in the join-codes API's style. api/openapi.yaml documents every
// route; Routes lists what the server serves and a test keeps the two
// equal.
//
// Who calls is a Principal. Over the unix socket the listener sets it from
// the peer credentials: root (or the listener's own user) is the bootstrap
// admin. Over HTTPS the caller presents a bearer API key that the
// bootstrap admin created; the key is bound to one tenant and carries
// grants (an action on a resource pattern: seeds 000 and 004) and scopes
// (the join-keys API, docs/api.md). Requests that carry Origin or Referer are refused, so a
// browser tricked into talking to a forwarded socket cannot act.
package adminapi

import (
	"context"
	"crypto/x509"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/stratumjoin/stratum/internal/cluster"
	"github.com/stratumjoin/stratum/internal/joincode"
	"github.com/stratumjoin/stratum/listener/registry"
	"github.com/stratumjoin/stratum/pki/authority"
)

// Core is what the admin API needs of the listener.
type Core interface {
	Cluster() *cluster.Cluster
	Mint(ctx context.Context, spec cluster.SecretSpec) (*cluster.Secret, joincode.Secret, error)
	CA() (*authority.CA, string)
	Roots() []*x509.Certificate
	RotateCA(ctx context.Context, actor string) (string, error)
	RetireCA(ctx context.Context, actor string) (int, error)
	Endpoint() string
	TrustDomain() string
	Registry() *registry.Registry
}

// Server serves the admin routes.
type Server struct {
	core   Core
	logger *slog.Logger
	mux    *http.ServeMux
	// strict holds only the routes, without the catch-all, to tell an
	// unknown path from a known path with another method.
	strict *http.ServeMux
	routes []route

	limitersMu sync.Mutex
	limiters   map[string]*rate.Limiter // per organization (the join-keys API, docs/api.md)
	authFails  authFailures             // failed API keys per source
}

// New returns the admin API over core.
func New(core Core, logger *slog.Logger) *Server {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{core: core, logger: logger, mux: http.NewServeMux(), strict: http.NewServeMux(), limiters: map[string]*rate.Limiter{}}
	s.authFails.sources.Limit, s.authFails.sources.Burst = rate.Every(authFailEvery), authFailBurst
	s.routes = s.routeTable()
	for _, rt := range s.routes {
		pattern := rt.method + " " + rt.path
		s.mux.Handle(pattern, s.handle(rt))
		s.strict.Handle(pattern, http.NotFoundHandler())
	}
	s.mux.HandleFunc("/", s.noRoute)
	return s
}

type ctxKey int

const (
	keyRequestID ctxKey = iota
	keyPrincipal
)

// Principal is who is calling.
type Principal struct {
	Name  string // "uid:0", "apikey:<id>"
	Admin bool   // bootstrap admin: may do everything
	// Tenant, Grants and Scopes bind an API key.
	Tenant string
	Grants []cluster.Grant
	Scopes []string
}

// may reports whether p may do action on resource.
func (p Principal) may(action, resource string) bool {
	if p.Admin {
		return true
	}
	for _, g := range p.Grants {
		if g.Allows(action, resource) {
			return true
		}
	}
	return false
}

func (p Principal) hasScope(scope string) bool {
	if p.Admin {
		return true
	}
	for _, s := range p.Scopes {
		if s == scope {
			return true
		}
	}
	return false
}

// actsFor reports whether p may act for tenant: the bootstrap admin for
// any, an API key for its own.
func (p Principal) actsFor(tenant string) bool { return p.Admin || p.Tenant == tenant }

// WithPrincipal marks a request's context with its caller; the socket
// server sets it from peer credentials.
func WithPrincipal(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, keyPrincipal, p)
}

func principalOf(r *http.Request) (Principal, bool) {
	p, ok := r.Context().Value(keyPrincipal).(Principal)
	return p, ok
}

func requestIDOf(r *http.Request) string {
	if id, ok := r.Context().Value(keyRequestID).(string); ok {
		return id
	}
	return "req-unknown"
}

// maxBody bounds every request body.
const maxBody = 1 << 20

// ServeHTTP refuses browser-originated requests, then routes. Every
// answer carries the request id in X-Request-Id.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id := requestID()
	r = r.WithContext(context.WithValue(r.Context(), keyRequestID, id))
	w.Header().Set("X-Request-Id", id)
	start := time.Now()
	rec := &statusRecorder{ResponseWriter: w}
	defer func() {
		// never the body or the query: only what identifies the request
		s.logger.Debug("admin request", "requestId", id, "method", r.Method, "path", r.URL.Path, "status", rec.status, "duration", time.Since(start))
	}()
	if r.Header.Get("Origin") != "" || r.Header.Get("Referer") != "" {
		s.fail(rec, r, facadeFor(r.URL.Path), errForbidden("requests from browsers are refused"))
		return
	}
	r.Body = http.MaxBytesReader(rec, r.Body, maxBody)
	s.mux.ServeHTTP(rec, r)
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// Flush lets long polls flush through the recorder.
func (s *statusRecorder) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// noRoute answers an unknown path 404 and a known path with another
// method 405, in the shape of the facade the path belongs to.
func (s *Server) noRoute(w http.ResponseWriter, r *http.Request) {
	f := facadeFor(r.URL.Path)
	var allowed []string
	for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
		probe := r.Clone(r.Context())
		probe.Method = m
		if _, pattern := s.strict.Handler(probe); pattern != "" {
			allowed = append(allowed, m)
		}
	}
	if len(allowed) > 0 {
		w.Header().Set("Allow", strings.Join(allowed, ", "))
		s.fail(w, r, f, &apiError{kind: kindMethod, msg: "method " + r.Method + " is not allowed here; use " + strings.Join(allowed, " or ")})
		return
	}
	s.fail(w, r, f, &apiError{kind: kindNotFound, msg: "no such route"})
}
