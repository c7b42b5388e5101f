// Package adminapi is the listener's admin API: one core (package
// cluster) behind HTTP routes. The cluster routes (/v1/admin/cluster/...)
// follow seed 004's style and errors (application/problem+json); the
// joinTokens and join-keys facades follow seeds 000 and 003.
//
// Over the unix socket the caller is identified by its peer credentials:
// root (or the listener's own user) is the bootstrap admin. Requests that
// carry Origin or Referer are refused, so a browser tricked into talking to
// a forwarded socket cannot act.
package adminapi

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/stratumjoin/stratum/internal/cluster"
	"github.com/stratumjoin/stratum/internal/joincode"
	"github.com/stratumjoin/stratum/pki"
)

// Core is what the admin API needs of the listener.
type Core interface {
	Cluster() *cluster.Cluster
	Mint(ctx context.Context, spec cluster.SecretSpec) (*cluster.Secret, joincode.Secret, error)
	CA() (*pki.CA, string)
	Roots() []*x509.Certificate
	RotateCA(ctx context.Context, actor string) (string, error)
	Endpoint() string
	TrustDomain() string
}

// Server serves the admin routes.
type Server struct {
	core   Core
	logger *slog.Logger
	mux    *http.ServeMux
}

// New returns the admin API over core.
func New(core Core, logger *slog.Logger) *Server {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{core: core, logger: logger, mux: http.NewServeMux()}
	s.routes()
	return s
}

type ctxKey int

const (
	keyRequestID ctxKey = iota
	keyPrincipal
)

// Principal is who is calling.
type Principal struct {
	Name  string // "uid:0", "apikey:ak_..."
	Admin bool   // bootstrap admin: may do everything
}

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

// ServeHTTP refuses browser-originated requests and unauthenticated
// callers, then routes.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	r = r.WithContext(context.WithValue(r.Context(), keyRequestID, requestID()))
	if r.Header.Get("Origin") != "" || r.Header.Get("Referer") != "" {
		writeProblem(w, r, http.StatusForbidden, CodeForbidden, "requests from browsers are refused")
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 1<<20)
	s.mux.ServeHTTP(w, r)
}

func (s *Server) routes() {
	s.mux.HandleFunc("GET /v1/admin/cluster/join-codes", s.admin(s.listCodes))
	s.mux.HandleFunc("POST /v1/admin/cluster/join-codes", s.admin(s.mintCode))
	s.mux.HandleFunc("GET /v1/admin/cluster/join-codes/{id}", s.admin(s.getCode))
	s.mux.HandleFunc("POST /v1/admin/cluster/join-codes/{id}/revoke", s.admin(s.revokeCode))
	s.mux.HandleFunc("GET /v1/admin/cluster/nodes", s.admin(s.listNodes))
	s.mux.HandleFunc("GET /v1/admin/cluster/nodes/{id}", s.admin(s.getNode))
	s.mux.HandleFunc("POST /v1/admin/cluster/nodes/{id}/revoke", s.admin(s.revokeNode))
	s.mux.HandleFunc("GET /v1/admin/cluster/joins", s.admin(s.listJoins))
	s.mux.HandleFunc("POST /v1/admin/cluster/joins/{id}/approve", s.admin(s.decideJoin(true)))
	s.mux.HandleFunc("POST /v1/admin/cluster/joins/{id}/refuse", s.admin(s.decideJoin(false)))
	s.mux.HandleFunc("GET /v1/admin/cluster/ca", s.admin(s.getCA))
	s.mux.HandleFunc("POST /v1/admin/cluster/ca/rotate", s.admin(s.rotateCA))
	s.mux.HandleFunc("GET /v1/admin/cluster/events", s.admin(s.listEvents))
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeProblem(w, r, http.StatusNotFound, CodeNotFound, "no such route")
	})
}

// admin lets only the bootstrap admin through (seed 004: ha:DescribeJoinCodes
// and the other cluster actions belong to it).
func (s *Server) admin(h func(http.ResponseWriter, *http.Request, Principal)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p, ok := principalOf(r)
		if !ok {
			writeProblem(w, r, http.StatusUnauthorized, CodeUnauthorized, "authentication required")
			return
		}
		if !p.Admin {
			writeProblem(w, r, http.StatusForbidden, CodeForbidden, "this action needs the bootstrap admin")
			return
		}
		h(w, r, p)
	}
}

// Code is a join code as seed 004 lists it, plus its policy.
type Code struct {
	ID              string          `json:"id"`
	Selector        string          `json:"selector"`
	FailedAttempts  int             `json:"failedAttempts"`
	Endpoint        string          `json:"endpoint"`
	CAFingerprint   string          `json:"caFingerprint"`
	State           string          `json:"state"`
	CreatedBy       string          `json:"createdBy,omitempty"`
	CreatedAt       time.Time       `json:"createdAt"`
	ExpiresAt       time.Time       `json:"expiresAt"`
	RevokedAt       *time.Time      `json:"revokedAt,omitempty"`
	RevokedBy       string          `json:"revokedBy,omitempty"`
	Registrations   int             `json:"registrations"`
	MaxUses         int             `json:"maxUses"`
	Uses            int             `json:"uses"`
	Pool            string          `json:"pool"`
	Role            string          `json:"role"`
	Trust           string          `json:"trust"`
	RequireApproval bool            `json:"requireApproval"`
	AllowReclaim    bool            `json:"allowReclaim"`
	Hosted          string          `json:"hosted,omitempty"`
	Expect          *cluster.Expect `json:"expect,omitempty"`
	// Code and AgentCommand are only in the response that mints it.
	Code         string `json:"code,omitempty"`
	AgentCommand string `json:"agentCommand,omitempty"`
}

// seed 004 knows live, expired and revoked; a code with no uses left no
// longer joins, which is closest to expired.
func codeState(s *cluster.Secret, now time.Time) string {
	st := s.State(now)
	if st == "used-up" {
		return "expired"
	}
	return st
}

func toCode(s *cluster.Secret, now time.Time) Code {
	c := Code{
		ID: s.ID, Selector: s.Locator, FailedAttempts: s.Unproven, Endpoint: s.Endpoint, CAFingerprint: s.CAFingerprint,
		State: codeState(s, now), CreatedBy: s.CreatedBy, CreatedAt: s.CreatedAt, RevokedAt: s.RevokedAt, RevokedBy: s.RevokedBy,
		Registrations: s.Registrations, MaxUses: s.MaxUses, Uses: s.Uses, Pool: s.Pool, Role: s.Role, Trust: s.Trust,
		RequireApproval: s.RequireApproval, AllowReclaim: s.AllowReclaim, Hosted: s.Hosted, Expect: s.Expect,
	}
	if s.ExpiresAt != nil {
		c.ExpiresAt = *s.ExpiresAt
	}
	return c
}

func (s *Server) listCodes(w http.ResponseWriter, r *http.Request, _ Principal) {
	secrets, err := s.core.Cluster().Secrets(r.Context(), cluster.KindCode)
	if err != nil {
		s.internal(w, r, err)
		return
	}
	sort.SliceStable(secrets, func(i, j int) bool { return secrets[i].CreatedAt.After(secrets[j].CreatedAt) })
	now := s.core.Cluster().Now()
	items := make([]Code, 0, len(secrets))
	for i := range secrets {
		items = append(items, toCode(&secrets[i], now))
	}
	writeJSON(w, http.StatusOK, map[string]any{"items": items})
}

// MintCodeRequest is the body of POST /v1/admin/cluster/join-codes.
type MintCodeRequest struct {
	TTLSeconds      int             `json:"ttlSeconds"`
	MaxUses         *int            `json:"maxUses"`
	Pool            string          `json:"pool"`
	RequireApproval bool            `json:"requireApproval"`
	Expect          *cluster.Expect `json:"expect"`
	AllowReclaim    bool            `json:"allowReclaim"`
	Hosted          string          `json:"hosted"`
}

var (
	poolRE        = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$`)
	productUUIDRE = regexp.MustCompile(`^[0-9A-Fa-f-]{8,64}$`)
	serialRE      = regexp.MustCompile(`^[A-Za-z0-9._:/+-]{1,128}$`)
	macRE         = regexp.MustCompile(`^[0-9A-Fa-f]{2}(?::[0-9A-Fa-f]{2}){5}$`)
	gpuUUIDRE     = regexp.MustCompile(`^GPU-[0-9A-Fa-f-]{8,64}$`)
)

// ValidateExpect checks an `expect` binding as seed 000 constrains it.
// prefix is the field path prefix ("expect").
func ValidateExpect(e *cluster.Expect, prefix string) []FieldError {
	if e == nil {
		return nil
	}
	var errs []FieldError
	check := func(name, v string, max int, re *regexp.Regexp) {
		if v == "" {
			return
		}
		switch {
		case len(v) > max:
			errs = append(errs, FieldError{prefix + "." + name, fmt.Sprintf("at most %d characters", max)})
		case !re.MatchString(v):
			errs = append(errs, FieldError{prefix + "." + name, "must match " + re.String()})
		case isPlaceholder(v):
			errs = append(errs, FieldError{prefix + "." + name, "is a firmware placeholder value, not a machine identity"})
		}
	}
	check("productUuid", e.ProductUUID, 64, productUUIDRE)
	check("serial", e.Serial, 128, serialRE)
	check("mac", e.MAC, 17, macRE)
	check("gpuUuid", e.GPUUUID, 68, gpuUUIDRE)
	if e.Empty() {
		errs = append(errs, FieldError{prefix, "must name at least one identifier: productUuid, serial, mac or gpuUuid"})
	}
	return errs
}

// isPlaceholder catches the firmware placeholders that seed 000's regexes
// let through (DESIGN.md section 5).
func isPlaceholder(v string) bool {
	u := strings.ToUpper(strings.ReplaceAll(v, "-", ""))
	if u != "" && (strings.Trim(u, "0") == "" || strings.Trim(u, "F") == "") {
		return true
	}
	switch u {
	case "03000200040005000006000700080009", "0123456789", "NONE", "N/A", "DEFAULTSTRING", "NOTSPECIFIED":
		return true
	}
	return false
}

func decodeBody(r *http.Request, v any) error {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			return errors.New("empty body")
		}
		return err
	}
	if dec.More() {
		return errors.New("trailing data after the JSON body")
	}
	return nil
}

func (s *Server) mintCode(w http.ResponseWriter, r *http.Request, p Principal) {
	var req MintCodeRequest
	if err := decodeBody(r, &req); err != nil {
		writeProblem(w, r, http.StatusBadRequest, CodeInvalidInput, "malformed JSON body: "+err.Error())
		return
	}
	var errs []FieldError
	if req.TTLSeconds == 0 {
		req.TTLSeconds = 3600
	}
	if req.TTLSeconds < 60 || req.TTLSeconds > 30*86400 {
		errs = append(errs, FieldError{"ttlSeconds", "must be 60-2592000"})
	}
	maxUses := 1
	if req.MaxUses != nil {
		maxUses = *req.MaxUses
	}
	if maxUses < 0 || maxUses > 10000 {
		errs = append(errs, FieldError{"maxUses", "must be 0 (unlimited) to 10000"})
	}
	if req.Pool == "" {
		req.Pool = cluster.DefaultPool
	}
	if !poolRE.MatchString(req.Pool) {
		errs = append(errs, FieldError{"pool", "must match " + poolRE.String()})
	}
	if req.Hosted != "" && req.Hosted != cluster.HostedKubernetes {
		errs = append(errs, FieldError{"hosted", "must be kubernetes or absent"})
	}
	errs = append(errs, ValidateExpect(req.Expect, "expect")...)
	if len(errs) > 0 {
		writeProblem(w, r, http.StatusBadRequest, CodeInvalidInput, "the request has invalid fields", errs...)
		return
	}
	now := s.core.Cluster().Now().UTC()
	exp := now.Add(time.Duration(req.TTLSeconds) * time.Second)
	id, err := joincode.RandomLowerBase32(5)
	if err != nil {
		s.internal(w, r, err)
		return
	}
	role, trust := cluster.RoleNode, cluster.TrustPlatform
	if req.Hosted == cluster.HostedKubernetes {
		role, trust = cluster.RoleNodeTenant, cluster.TrustTenantControlled
	}
	sec := cluster.Secret{
		ID: "jc-" + id, Kind: cluster.KindCode, Tenant: cluster.DefaultTenant, Pool: req.Pool, Role: role, Trust: trust,
		Hosted: req.Hosted, Expect: req.Expect, AllowReclaim: req.AllowReclaim, RequireApproval: req.RequireApproval,
		MaxUses: maxUses, CreatedBy: p.Name, ExpiresAt: &exp,
	}
	stored, code, err := s.core.Mint(r.Context(), cluster.SecretSpec{Secret: sec, EventType: cluster.EventCodeCreated, EventFields: map[string]string{"pinned": strconv.FormatBool(!req.Expect.Empty())}})
	if errors.Is(err, cluster.ErrLimitExceeded) {
		writeProblem(w, r, http.StatusConflict, CodeLimitExceeded, "all 1024 join code selectors are held by live codes; revoke some or wait for them to expire")
		return
	}
	if err != nil {
		s.internal(w, r, err)
		return
	}
	out := toCode(stored, now)
	out.Code = code.Display()
	out.AgentCommand = fmt.Sprintf("stratum-agent join --endpoint %s --ca-fingerprint %s --code -", stored.Endpoint, stored.CAFingerprint)
	writeJSON(w, http.StatusCreated, out)
}

func (s *Server) getCode(w http.ResponseWriter, r *http.Request, _ Principal) {
	sec, err := s.core.Cluster().Secret(r.Context(), r.PathValue("id"))
	if err != nil || sec.Kind != cluster.KindCode {
		s.notFound(w, r, err, "join code")
		return
	}
	writeJSON(w, http.StatusOK, toCode(sec, s.core.Cluster().Now()))
}

func (s *Server) revokeCode(w http.ResponseWriter, r *http.Request, p Principal) {
	sec, err := s.core.Cluster().Secret(r.Context(), r.PathValue("id"))
	if err != nil || sec.Kind != cluster.KindCode {
		s.notFound(w, r, err, "join code")
		return
	}
	sec, _, err = s.core.Cluster().RevokeSecret(r.Context(), sec.ID, p.Name, cluster.EventCodeRevoked, nil)
	if err != nil {
		s.internal(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toCode(sec, s.core.Cluster().Now()))
}

// NodeView is a node as the admin API shows it. Facts are claimed by the
// machine, never attested.
type NodeView struct {
	cluster.Node
	ClaimedFacts any    `json:"claimedFacts"`
	FactsNote    string `json:"factsNote"`
}

func nodeView(n cluster.Node) NodeView {
	return NodeView{Node: n, ClaimedFacts: n.Facts, FactsNote: "claimed by the machine at join, not attested"}
}

func (s *Server) listNodes(w http.ResponseWriter, r *http.Request, _ Principal) {
	nodes, err := s.core.Cluster().Nodes(r.Context())
	if err != nil {
		s.internal(w, r, err)
		return
	}
	items := make([]NodeView, 0, len(nodes))
	for _, n := range nodes {
		items = append(items, nodeView(n))
	}
	writeJSON(w, http.StatusOK, map[string]any{"items": items})
}

func (s *Server) getNode(w http.ResponseWriter, r *http.Request, _ Principal) {
	n, err := s.core.Cluster().Node(r.Context(), r.PathValue("id"))
	if err != nil {
		s.notFound(w, r, err, "node")
		return
	}
	writeJSON(w, http.StatusOK, nodeView(*n))
}

func (s *Server) revokeNode(w http.ResponseWriter, r *http.Request, p Principal) {
	n, err := s.core.Cluster().RevokeNode(r.Context(), r.PathValue("id"), p.Name)
	if err != nil {
		s.notFound(w, r, err, "node")
		return
	}
	writeJSON(w, http.StatusOK, nodeView(*n))
}

func (s *Server) listJoins(w http.ResponseWriter, r *http.Request, _ Principal) {
	joins, err := s.core.Cluster().Joins(r.Context())
	if err != nil {
		s.internal(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"items": joins})
}

func (s *Server) decideJoin(approve bool) func(http.ResponseWriter, *http.Request, Principal) {
	return func(w http.ResponseWriter, r *http.Request, p Principal) {
		j, err := s.core.Cluster().DecideJoin(r.Context(), r.PathValue("id"), p.Name, approve)
		if errors.Is(err, cluster.ErrInvalidState) {
			writeProblem(w, r, http.StatusConflict, CodeInvalidState, err.Error())
			return
		}
		if err != nil {
			s.notFound(w, r, err, "join")
			return
		}
		writeJSON(w, http.StatusOK, j)
	}
}

// CAView describes the cluster CA.
type CAView struct {
	Fingerprint  string    `json:"caFingerprint"`
	Subject      string    `json:"subject"`
	NotBefore    time.Time `json:"notBefore"`
	NotAfter     time.Time `json:"notAfter"`
	Intermediate bool      `json:"intermediate"`
	RootsPEM     string    `json:"rootsPem"`
	TrustDomain  string    `json:"trustDomain"`
	Endpoint     string    `json:"endpoint"`
}

func (s *Server) caView() CAView {
	ca, fp := s.core.CA()
	return CAView{
		Fingerprint: fp, Subject: ca.Cert().Subject.String(), NotBefore: ca.Cert().NotBefore, NotAfter: ca.Cert().NotAfter,
		Intermediate: !ca.IsRoot(), RootsPEM: string(pki.EncodeCertsPEM(s.core.Roots())), TrustDomain: s.core.TrustDomain(), Endpoint: s.core.Endpoint(),
	}
}

func (s *Server) getCA(w http.ResponseWriter, r *http.Request, _ Principal) {
	writeJSON(w, http.StatusOK, s.caView())
}

func (s *Server) rotateCA(w http.ResponseWriter, r *http.Request, p Principal) {
	if _, err := s.core.RotateCA(r.Context(), p.Name); err != nil {
		s.internal(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.caView())
}

func (s *Server) listEvents(w http.ResponseWriter, r *http.Request, _ Principal) {
	q := r.URL.Query()
	limit := 1000
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			writeProblem(w, r, http.StatusBadRequest, CodeInvalidInput, "limit must be 1-1000", FieldError{"limit", "must be 1-1000"})
			return
		}
		limit = n
	}
	var wait time.Duration
	if v := q.Get("wait"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 || d > 5*time.Minute {
			writeProblem(w, r, http.StatusBadRequest, CodeInvalidInput, "wait must be a duration up to 5m", FieldError{"wait", "must be a duration up to 5m"})
			return
		}
		wait = d
	}
	deadline := time.Now().Add(wait)
	for {
		evs, err := s.core.Cluster().Events(r.Context(), q.Get("after"), limit)
		if err != nil {
			s.internal(w, r, err)
			return
		}
		if len(evs) > 0 || time.Now().After(deadline) {
			writeJSON(w, http.StatusOK, map[string]any{"items": evs})
			return
		}
		select {
		case <-r.Context().Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (s *Server) notFound(w http.ResponseWriter, r *http.Request, err error, what string) {
	if err == nil || errors.Is(err, cluster.ErrNotFound) {
		writeProblem(w, r, http.StatusNotFound, CodeNotFound, "no such "+what)
		return
	}
	s.internal(w, r, err)
}

// internal logs the error and answers without echoing it.
func (s *Server) internal(w http.ResponseWriter, r *http.Request, err error) {
	s.logger.Error("admin request failed", "requestId", requestIDOf(r), "path", r.URL.Path, "err", err)
	writeProblem(w, r, http.StatusInternalServerError, CodeInternal, "internal error; see the listener log for request "+requestIDOf(r))
}
