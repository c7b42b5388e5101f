package adminapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/stratumjoin/stratum/internal/cluster"
	"github.com/stratumjoin/stratum/internal/joincode"
	"github.com/stratumjoin/stratum/pki"
)

// Code is a join code as the join-codes API lists it, plus its policy.
type Code struct {
	ID             string `json:"id"`
	Selector       string `json:"selector"`
	FailedAttempts int    `json:"failedAttempts"`
	Endpoint       string `json:"endpoint"`
	// Endpoints lists every listener of the cluster, Endpoint first.
	Endpoints       []string        `json:"endpoints,omitempty"`
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
	Tenant          string          `json:"tenant"`
	Role            string          `json:"role"`
	Trust           string          `json:"trust"`
	RequireApproval bool            `json:"requireApproval"`
	AllowReclaim    bool            `json:"allowReclaim"`
	Hosted          string          `json:"hosted,omitempty"`
	Expect          *cluster.Expect `json:"expect,omitempty"`
	// Description and Labels are the operator's, as minted; absent when
	// none were given.
	Description string            `json:"description,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	// Code and AgentCommand are only in the response that mints it.
	Code         string `json:"code,omitempty"`
	AgentCommand string `json:"agentCommand,omitempty"`
}

// the join-codes API knows live, expired and revoked. A code whose last use is
// spent is revoked by system:used-up at that moment; one used up before
// that rule (with no revocation recorded) is listed revoked too.
func codeState(s *cluster.Secret, now time.Time) string {
	st := s.State(now)
	if st == "used-up" {
		return "revoked"
	}
	return st
}

func toCode(s *cluster.Secret, now time.Time) Code {
	c := Code{
		ID: s.ID, Selector: s.Locator, FailedAttempts: s.Unproven, Endpoint: s.Endpoint, Endpoints: s.Endpoints, CAFingerprint: s.CAFingerprint,
		State: codeState(s, now), CreatedBy: s.CreatedBy, CreatedAt: s.CreatedAt, RevokedAt: s.RevokedAt, RevokedBy: s.RevokedBy,
		Registrations: s.Registrations, MaxUses: s.MaxUses, Uses: s.Uses, Pool: s.Pool, Tenant: s.Tenant, Role: s.Role, Trust: s.Trust,
		RequireApproval: s.RequireApproval, AllowReclaim: s.AllowReclaim, Hosted: s.Hosted, Expect: s.Expect,
		Description: s.Description, Labels: s.Labels,
	}
	if s.ExpiresAt != nil {
		c.ExpiresAt = *s.ExpiresAt
	}
	return c
}

func (s *Server) listCodes(w http.ResponseWriter, r *http.Request, p Principal) error {
	if !p.may(ActionDescribeJoinCodes, ResourceCluster) {
		return errForbidden("needs " + ActionDescribeJoinCodes + " on " + ResourceCluster)
	}
	secrets, err := s.core.Cluster().Secrets(r.Context(), cluster.KindCode)
	if err != nil {
		return errInternal(err)
	}
	sort.SliceStable(secrets, func(i, j int) bool { return secrets[i].CreatedAt.After(secrets[j].CreatedAt) })
	want, ferrs := parseLabelSelector(r.URL.Query()["label"])
	if len(ferrs) > 0 {
		return errInvalid("the query has invalid parameters", ferrs...)
	}
	now := s.core.Cluster().Now()
	items := make([]Code, 0, len(secrets))
	for i := range secrets {
		if p.actsFor(secrets[i].Tenant) && hasLabels(secrets[i].Labels, want) {
			items = append(items, toCode(&secrets[i], now))
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"items": items})
	return nil
}

// MintCodeRequest is the body of POST /v1/admin/cluster/join-codes.
type MintCodeRequest struct {
	TTLSeconds int    `json:"ttlSeconds,omitempty"`
	MaxUses    *int   `json:"maxUses,omitempty"` // default 0: every machine of the batch
	Pool       string `json:"pool,omitempty"`
	// AutoApprove joins machines without an approval. By default every
	// join with a code is held until an administrator approves it: a
	// batch code serves many machines, and the approval is the gate.
	AutoApprove  bool            `json:"autoApprove,omitempty"`
	Expect       *cluster.Expect `json:"expect,omitempty"`
	AllowReclaim bool            `json:"allowReclaim,omitempty"`
	Hosted       string          `json:"hosted,omitempty"`
	// Description is free text for the operator, at most
	// MaxDescription characters; Labels are at most MaxLabels key=value
	// pairs, keys and values as labelKeyRE and labelValueRE allow.
	Description string            `json:"description,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
}

// Join code defaults and bounds.
const (
	DefaultCodeTTL = time.Hour
	MaxCodeTTL     = 30 * 24 * time.Hour
)

func (req *MintCodeRequest) validate() []fieldError {
	var errs []fieldError
	if req.TTLSeconds == 0 {
		req.TTLSeconds = int(DefaultCodeTTL / time.Second)
	}
	if req.TTLSeconds < 60 || req.TTLSeconds > int(MaxCodeTTL/time.Second) {
		errs = append(errs, fieldError{path: "ttlSeconds", msg: fmt.Sprintf("must be 60-%d", int(MaxCodeTTL/time.Second))})
	}
	if req.MaxUses == nil {
		unlimited := 0
		req.MaxUses = &unlimited
	}
	if *req.MaxUses < 0 || *req.MaxUses > 10000 {
		errs = append(errs, fieldError{path: "maxUses", msg: "must be 0 (unlimited) to 10000"})
	}
	if req.Pool == "" {
		req.Pool = cluster.DefaultPool
	}
	errs = append(errs, checkString("pool", req.Pool, true, 128, poolRE)...)
	if req.Hosted != "" && req.Hosted != cluster.HostedKubernetes {
		errs = append(errs, fieldError{path: "hosted", msg: "must be kubernetes or absent"})
	}
	errs = append(errs, validateDescription("description", req.Description)...)
	errs = append(errs, validateLabels("labels", req.Labels)...)
	return append(errs, validateExpect(req.Expect, "expect")...)
}

func (s *Server) mintCode(w http.ResponseWriter, r *http.Request, p Principal) error {
	if !p.may(ActionCreateJoinCode, ResourceCluster) {
		return errForbidden("needs " + ActionCreateJoinCode + " on " + ResourceCluster)
	}
	var req MintCodeRequest
	if err := decodeStrict(r.Body, &req); err != nil {
		return err
	}
	if errs := req.validate(); len(errs) > 0 {
		return errInvalid("the request has invalid fields", errs...)
	}
	pool, ok := s.core.Registry().Pool(req.Pool)
	if !ok || !p.actsFor(pool.Tenant) {
		return errNotFound("pool " + req.Pool)
	}
	if err := mintablePool(pool); err != nil {
		return err
	}
	now := s.core.Cluster().Now().UTC()
	exp := now.Add(time.Duration(req.TTLSeconds) * time.Second)
	id, err := joincode.RandomLowerBase32(5)
	if err != nil {
		return errInternal(err)
	}
	role, trust := s.core.Registry().Trust(pool, req.Hosted)
	sec := cluster.Secret{
		ID: "jc-" + id, Kind: cluster.KindCode, Tenant: pool.Tenant, Pool: pool.ID, Role: role, Trust: trust,
		Hosted: req.Hosted, Expect: req.Expect, AllowReclaim: req.AllowReclaim, RequireApproval: !req.AutoApprove,
		MaxUses: *req.MaxUses, CreatedBy: p.Name, ExpiresAt: &exp, Description: req.Description, Labels: req.Labels,
	}
	fields := map[string]any{"pool": pool.ID, "tenant": pool.Tenant, "pinned": !req.Expect.Empty(), "trust": trust}
	if req.Hosted != "" {
		fields["hosted"] = req.Hosted
	}
	stored, code, err := s.core.Mint(r.Context(), cluster.SecretSpec{Secret: sec, EventType: cluster.EventCodeCreated, EventFields: fields})
	if errors.Is(err, cluster.ErrLimitExceeded) {
		return &apiError{kind: kindLimit, msg: "all 1024 join code selectors are held by live codes; revoke some or wait for them to expire"}
	}
	if err != nil {
		return errInternal(err)
	}
	out := toCode(stored, now)
	out.Code = code.Display()
	out.AgentCommand = AgentCommand(stored)
	writeJSON(w, http.StatusCreated, out)
	return nil
}

// codeFor loads a join code the caller may see.
func (s *Server) codeFor(r *http.Request, p Principal) (*cluster.Secret, error) {
	sec, err := s.core.Cluster().Secret(r.Context(), r.PathValue("id"))
	if errors.Is(err, cluster.ErrNotFound) || err == nil && (sec.Kind != cluster.KindCode || !p.actsFor(sec.Tenant)) {
		return nil, errNotFound("join code")
	}
	if err != nil {
		return nil, errInternal(err)
	}
	return sec, nil
}

func (s *Server) getCode(w http.ResponseWriter, r *http.Request, p Principal) error {
	if !p.may(ActionDescribeJoinCodes, ResourceCluster) {
		return errForbidden("needs " + ActionDescribeJoinCodes + " on " + ResourceCluster)
	}
	sec, err := s.codeFor(r, p)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, toCode(sec, s.core.Cluster().Now()))
	return nil
}

func (s *Server) revokeCode(w http.ResponseWriter, r *http.Request, p Principal) error {
	if !p.may(ActionRevokeJoinCode, ResourceCluster) {
		return errForbidden("needs " + ActionRevokeJoinCode + " on " + ResourceCluster)
	}
	sec, err := s.codeFor(r, p)
	if err != nil {
		return err
	}
	sec, _, err = s.core.Cluster().RevokeSecret(r.Context(), sec.ID, p.Name, cluster.EventCodeRevoked, map[string]any{"pool": sec.Pool, "tenant": sec.Tenant})
	if err != nil {
		return errInternal(err)
	}
	writeJSON(w, http.StatusOK, toCode(sec, s.core.Cluster().Now()))
	return nil
}

// resetAttempts forgets the failed attempts of a live code (its holders
// lost them to crashes, say); in-flight attempts stay counted. It gates on
// revoking: both decide whether the code can still be used.
func (s *Server) resetAttempts(w http.ResponseWriter, r *http.Request, p Principal) error {
	if !p.may(ActionRevokeJoinCode, ResourceCluster) {
		return errForbidden("needs " + ActionRevokeJoinCode + " on " + ResourceCluster)
	}
	sec, err := s.codeFor(r, p)
	if err != nil {
		return err
	}
	sec, err = s.core.Cluster().ResetAttempts(r.Context(), sec.ID, p.Name)
	if errors.Is(err, cluster.ErrInvalidState) {
		return &apiError{kind: kindInvalidState, msg: "only a live join code's attempts can be reset; this one is no longer live"}
	}
	if err != nil {
		return errInternal(err)
	}
	writeJSON(w, http.StatusOK, toCode(sec, s.core.Cluster().Now()))
	return nil
}

// NodeView is a node as the admin API shows it. Facts are claimed by the
// machine, never attested; Attested is what its TPM proved, if anything.
type NodeView struct {
	cluster.Node
	ClaimedFacts any           `json:"claimedFacts"`
	FactsNote    string        `json:"factsNote"`
	Attested     *AttestedView `json:"attested,omitempty"`
}

// AttestedView is what a TPM attestation proved at join (docs/tpm.md).
type AttestedView struct {
	// EKHash is the SHA-256 of the TPM's endorsement key.
	EKHash string `json:"ekHash"`
	// EKCertVerified: the EK certificate chained to the manufacturer roots
	// the listener was given (serve --tpm-ca-dir).
	EKCertVerified bool   `json:"ekCertVerified"`
	EKIssuer       string `json:"ekIssuer,omitempty"`
	// KeyInTPM: the node key was certified by the TPM as created in it.
	KeyInTPM bool `json:"keyInTpm"`
}

func nodeView(n cluster.Node) NodeView {
	v := NodeView{Node: n, ClaimedFacts: n.Facts, FactsNote: "claimed by the machine at join, not attested"}
	if n.TPM != nil {
		v.Attested = &AttestedView{EKHash: n.TPM.EKHash, EKCertVerified: n.TPM.EKCertVerified, EKIssuer: n.TPM.EKIssuer, KeyInTPM: true}
	}
	return v
}

// lookupErr maps a core lookup error: not found is said plainly, anything
// else is internal.
func lookupErr(err error, what string) error {
	if errors.Is(err, cluster.ErrNotFound) {
		return errNotFound(what)
	}
	return errInternal(err)
}

func (s *Server) listNodes(w http.ResponseWriter, r *http.Request, _ Principal) error {
	nodes, err := s.core.Cluster().Nodes(r.Context())
	if err != nil {
		return errInternal(err)
	}
	items := make([]NodeView, 0, len(nodes))
	for _, n := range nodes {
		items = append(items, nodeView(n))
	}
	writeJSON(w, http.StatusOK, map[string]any{"items": items})
	return nil
}

func (s *Server) getNode(w http.ResponseWriter, r *http.Request, _ Principal) error {
	n, err := s.core.Cluster().Node(r.Context(), r.PathValue("id"))
	if err != nil {
		return lookupErr(err, "node")
	}
	writeJSON(w, http.StatusOK, nodeView(*n))
	return nil
}

func (s *Server) revokeNode(w http.ResponseWriter, r *http.Request, p Principal) error {
	n, err := s.core.Cluster().RevokeNode(r.Context(), r.PathValue("id"), p.Name)
	if err != nil {
		return lookupErr(err, "node")
	}
	writeJSON(w, http.StatusOK, nodeView(*n))
	return nil
}

// joinTenant is the tenant a join's pool belongs to.
func (s *Server) joinTenant(j *cluster.Join) string {
	if pool, ok := s.core.Registry().Pool(j.Pool); ok {
		return pool.Tenant
	}
	return cluster.DefaultTenant
}

func (s *Server) listJoins(w http.ResponseWriter, r *http.Request, p Principal) error {
	if !p.may(ActionDescribeNodeJoins, ResourceCluster) {
		return errForbidden("needs " + ActionDescribeNodeJoins + " on " + ResourceCluster)
	}
	joins, err := s.core.Cluster().Joins(r.Context())
	if err != nil {
		return errInternal(err)
	}
	items := make([]cluster.Join, 0, len(joins))
	for i := range joins {
		if p.actsFor(s.joinTenant(&joins[i])) {
			items = append(items, joins[i])
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"items": items})
	return nil
}

// joinFor loads a join the caller may see.
func (s *Server) joinFor(r *http.Request, p Principal) (*cluster.Join, error) {
	j, err := s.core.Cluster().Join(r.Context(), r.PathValue("id"))
	if err != nil {
		return nil, lookupErr(err, "join")
	}
	if !p.actsFor(s.joinTenant(j)) {
		return nil, errNotFound("join")
	}
	return j, nil
}

func (s *Server) getJoin(w http.ResponseWriter, r *http.Request, p Principal) error {
	if !p.may(ActionDescribeNodeJoins, ResourceCluster) {
		return errForbidden("needs " + ActionDescribeNodeJoins + " on " + ResourceCluster)
	}
	j, err := s.joinFor(r, p)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, j)
	return nil
}

// DecideJoinRequest is the optional body of an approval or refusal: sas,
// when given, must be the join's short authentication string, the six
// digits its agent prints.
type DecideJoinRequest struct {
	SAS string `json:"sas,omitempty"`
}

var sasRE = regexp.MustCompile(`^[0-9]{3}[ -]?[0-9]{3}$`)

func (s *Server) decideJoin(approve bool) handlerFunc {
	action := ActionApproveNodeJoin
	if !approve {
		action = ActionRefuseNodeJoin
	}
	return func(w http.ResponseWriter, r *http.Request, p Principal) error {
		if !p.may(action, ResourceCluster) {
			return errForbidden("needs " + action + " on " + ResourceCluster)
		}
		var req DecideJoinRequest
		if r.ContentLength != 0 {
			if err := decodeStrict(r.Body, &req); err != nil {
				return err
			}
		}
		if req.SAS != "" && !sasRE.MatchString(req.SAS) {
			return errInvalid("the request has invalid fields", fieldError{path: "sas", msg: "must be the 6 digits the agent prints"})
		}
		if _, err := s.joinFor(r, p); err != nil {
			return err
		}
		j, err := s.core.Cluster().DecideJoin(r.Context(), r.PathValue("id"), p.Name, approve, req.SAS)
		if errors.Is(err, cluster.ErrSASMismatch) {
			return &apiError{kind: kindApprovalRefused, msg: "the SAS given is not this join's: the machine you checked did not make join " + j.ID + "; it stays pending",
				fields: []fieldError{{path: "sas", msg: "does not match the join's short authentication string"}}}
		}
		if errors.Is(err, cluster.ErrInvalidState) {
			return &apiError{kind: kindInvalidState, msg: "the join is " + j.State + ", not pending"}
		}
		if err != nil {
			return lookupErr(err, "join")
		}
		writeJSON(w, http.StatusOK, j)
		return nil
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

// backer is what a core that can back up its store offers.
type backer interface {
	Backup(ctx context.Context, w io.Writer) (int64, error)
}

// backupStore streams a consistent copy of the store, as a bbolt file,
// taken while the listener serves. It is written to a temporary file
// first, so a failure is answered as one and never as a short file.
func (s *Server) backupStore(w http.ResponseWriter, r *http.Request, _ Principal) error {
	b, ok := s.core.(backer)
	if !ok {
		return &apiError{kind: kindInvalidState, msg: "this listener cannot back up its store"}
	}
	tmp, err := os.CreateTemp("", "stratum-backup-*")
	if err != nil {
		return errInternal(err)
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	n, err := b.Backup(r.Context(), tmp)
	if err != nil {
		return errInternal(fmt.Errorf("backup: %w", err))
	}
	if _, err := tmp.Seek(0, io.SeekStart); err != nil {
		return errInternal(err)
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
	w.WriteHeader(http.StatusOK)
	_, _ = io.Copy(w, tmp)
	return nil
}

func (s *Server) getCA(w http.ResponseWriter, _ *http.Request, _ Principal) error {
	writeJSON(w, http.StatusOK, s.caView())
	return nil
}

func (s *Server) rotateCA(w http.ResponseWriter, r *http.Request, p Principal) error {
	if _, err := s.core.RotateCA(r.Context(), p.Name); err != nil {
		return errInternal(err)
	}
	writeJSON(w, http.StatusOK, s.caView())
	return nil
}

// RetireView is what `ca retire` answers: the CA that stays, and how many
// secrets minted under the retired roots were revoked.
type RetireView struct {
	CAView
	RevokedSecrets int `json:"revokedSecrets"`
}

func (s *Server) retireCA(w http.ResponseWriter, r *http.Request, p Principal) error {
	n, err := s.core.RetireCA(r.Context(), p.Name)
	if err != nil {
		return errInternal(err)
	}
	writeJSON(w, http.StatusOK, RetireView{CAView: s.caView(), RevokedSecrets: n})
	return nil
}

func (s *Server) listEvents(w http.ResponseWriter, r *http.Request, _ Principal) error {
	q := r.URL.Query()
	limit := 1000
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			return errInvalid("limit must be 1-1000", fieldError{path: "limit", msg: "must be 1-1000"})
		}
		limit = n
	}
	var wait time.Duration
	if v := q.Get("wait"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 || d > 5*time.Minute {
			return errInvalid("wait must be a duration up to 5m", fieldError{path: "wait", msg: "must be a duration up to 5m"})
		}
		wait = d
	}
	deadline := time.Now().Add(wait)
	for {
		evs, err := s.core.Cluster().Events(r.Context(), q.Get("after"), limit)
		if err != nil {
			return errInternal(err)
		}
		if len(evs) > 0 || time.Now().After(deadline) {
			writeJSON(w, http.StatusOK, map[string]any{"items": evs})
			return nil
		}
		select {
		case <-r.Context().Done():
			return nil
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// AgentCommand is the command that joins a machine with the secret: every
// endpoint of the cluster, so that the agent fails over when one is down.
func AgentCommand(s *cluster.Secret) string {
	eps := s.Endpoints
	if len(eps) == 0 {
		eps = []string{s.Endpoint}
	}
	var b strings.Builder
	b.WriteString("stratum-agent join")
	for _, ep := range eps {
		b.WriteString(" --endpoint " + ep)
	}
	b.WriteString(" --ca-fingerprint " + s.CAFingerprint + " --code -")
	return b.String()
}
