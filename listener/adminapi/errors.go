package adminapi

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/stratumjoin/stratum/internal/cluster"
)

// kind is what went wrong, independent of any facade; Server.fail maps it
// to each seed's status, code and shape, in this one place.
type kind int

const (
	kindInternal kind = iota
	kindInvalid
	kindUnauthenticated
	kindForbidden
	kindNotFound
	kindMethod
	kindConflict
	kindInvalidState
	kindDuplicate   // the join-keys API: a unique value is taken
	kindLimit       // a count limit is reached
	kindRateLimited // the join-keys API: the organization's request rate; failed API keys per source
	kindMediaType   // a request body that is not application/json
	// kindApprovalRefused: an approval whose SAS is not the join's
	kindApprovalRefused
	kindUnavailable // the store did not answer in time, is full or damaged
)

// apiError is a failure with a message that is safe to show. cause, for
// internal errors, is only logged.
type apiError struct {
	kind   kind
	msg    string
	fields []fieldError
	// param is the query parameter at fault (the join-keys API, docs/api.md).
	param string
	// limit and limitName describe a kindLimit (the join-keys API's extra).
	limit     int
	limitName string
	cause     error
	// retryAfter, when set, is sent as Retry-After.
	retryAfter time.Duration
}

func (e *apiError) Error() string { return e.msg }

// fieldError is one field's problem. code is the join-keys API's code for it
// (ERR_INVALID_VALUE when empty); the other facades only show field and
// message.
type fieldError struct {
	path string
	msg  string
	code string
}

// Seed-003 field error codes.
const (
	keyErrInvalidValue     = "ERR_INVALID_VALUE"
	keyErrMissingValue     = "ERR_MISSING_VALUE"
	keyErrInvalidReference = "ERR_INVALID_REFERENCE"
)

func errInvalid(msg string, fields ...fieldError) *apiError {
	return &apiError{kind: kindInvalid, msg: msg, fields: fields}
}

func errForbidden(msg string) *apiError { return &apiError{kind: kindForbidden, msg: msg} }

func errNotFound(what string) *apiError {
	return &apiError{kind: kindNotFound, msg: what + " not found"}
}

func errInternal(cause error) *apiError { return &apiError{kind: kindInternal, cause: cause} }

// FieldError is one field's problem (the join-codes API FieldError; the joinTokens API's
// details use the same shape).
type FieldError struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

// Problem is the join-codes API's application/problem+json error.
type Problem struct {
	Type      string       `json:"type"`
	Title     string       `json:"title"`
	Status    int          `json:"status"`
	Detail    string       `json:"detail,omitempty"`
	Instance  string       `json:"instance,omitempty"`
	RequestID string       `json:"requestId"`
	Code      string       `json:"code"`
	Errors    []FieldError `json:"errors,omitempty"`
}

// Problem codes of the cluster routes (the join-codes API, docs/api.md).
const (
	CodeInvalidInput    = "INVALID_INPUT"
	CodeNotFound        = "NOT_FOUND"
	CodeForbidden       = "FORBIDDEN"
	CodeUnauthorized    = "UNAUTHORIZED"
	CodeLimitExceeded   = "LIMIT_EXCEEDED"
	CodeInvalidState    = "INVALID_STATE"
	CodeConflict        = "CONFLICT"
	CodeInternal        = "INTERNAL"
	CodeMethod          = "METHOD_NOT_ALLOWED"
	CodeTooMany         = "TOO_MANY_REQUESTS"
	CodeUnavailable     = "UNAVAILABLE"
	CodeMediaType       = "UNSUPPORTED_MEDIA_TYPE"
	CodeApprovalRefused = "JOIN_APPROVAL_REFUSED"
	problemTypeBase     = "https://stratum.dev/problems/"
	problemContentType  = "application/problem+json"
)

// TokenError is the joinTokens API's error body: {"error": TokenError}.
type TokenError struct {
	Code      string       `json:"code"`
	Message   string       `json:"message"`
	RequestID string       `json:"requestId"`
	Details   []FieldError `json:"details,omitempty"`
}

// Seed-000 error codes: the four the seed names, and the ones for
// authentication, authorization and everything else.
const (
	TokenInvalidInput     = "INVALID_INPUT"
	TokenNotFound         = "NOT_FOUND"
	TokenConflict         = "CONFLICT"
	TokenInvalidState     = "INVALID_STATE"
	TokenUnauthenticated  = "UNAUTHENTICATED"
	TokenPermissionDenied = "PERMISSION_DENIED"
	TokenMethod           = "METHOD_NOT_ALLOWED"
	TokenInternal         = "INTERNAL"
	TokenUnavailable      = "UNAVAILABLE"
)

// KeyError is one entry of the join-keys API's {"errors": [...]}.
type KeyError struct {
	Code    string         `json:"code"`
	Message string         `json:"message"`
	Path    string         `json:"path,omitempty"`
	Param   string         `json:"param,omitempty"`
	Extra   map[string]any `json:"extra,omitempty"`
}

// Seed-003 error codes.
const (
	KeyErrDuplicateValue = "ERR_DUPLICATE_VALUE"
	KeyErrLimitExceeded  = "ERR_LIMIT_EXCEEDED"
	KeyErrUnauthorized   = "ERR_UNAUTHORIZED"
	KeyErrForbidden      = "ERR_FORBIDDEN"
	KeyErrTooMany        = "ERR_TOO_MANY_REQUESTS"
	KeyErrMediaType      = "ERR_UNSUPPORTED_MEDIA_TYPE"
	KeyErrNotFound       = "ERR_NOT_FOUND"
	KeyErrMethod         = "ERR_METHOD_NOT_ALLOWED"
	KeyErrInternal       = "ERR_INTERNAL"
	KeyErrUnavailable    = "ERR_SERVICE_UNAVAILABLE"
)

// mapping is a kind's status and its code in each facade: code for the
// cluster routes (the join-codes API, docs/api.md), token for the joinTokens API, key for the join-keys API. A
// facade that never produces a kind (rate limits outside the join-keys API, say)
// still maps it, to its nearest code.
type mapping struct {
	status int
	code   string
	token  string
	key    string
}

var mappings = map[kind]mapping{
	kindInvalid:         {http.StatusBadRequest, CodeInvalidInput, TokenInvalidInput, keyErrInvalidValue},
	kindUnauthenticated: {http.StatusUnauthorized, CodeUnauthorized, TokenUnauthenticated, KeyErrUnauthorized},
	kindForbidden:       {http.StatusForbidden, CodeForbidden, TokenPermissionDenied, KeyErrForbidden},
	kindNotFound:        {http.StatusNotFound, CodeNotFound, TokenNotFound, KeyErrNotFound},
	kindMethod:          {http.StatusMethodNotAllowed, CodeMethod, TokenMethod, KeyErrMethod},
	kindConflict:        {http.StatusConflict, CodeConflict, TokenConflict, KeyErrDuplicateValue},
	kindInvalidState:    {http.StatusConflict, CodeInvalidState, TokenInvalidState, keyErrInvalidValue},
	kindDuplicate:       {http.StatusBadRequest, CodeConflict, TokenConflict, KeyErrDuplicateValue},
	kindLimit:           {http.StatusBadRequest, CodeLimitExceeded, TokenInvalidState, KeyErrLimitExceeded},
	kindRateLimited:     {http.StatusTooManyRequests, CodeTooMany, TokenInternal, KeyErrTooMany},
	kindInternal:        {http.StatusInternalServerError, CodeInternal, TokenInternal, KeyErrInternal},
	kindMediaType:       {http.StatusUnsupportedMediaType, CodeMediaType, TokenInvalidInput, KeyErrMediaType},
	kindApprovalRefused: {http.StatusConflict, CodeApprovalRefused, TokenInvalidState, keyErrInvalidValue},
	kindUnavailable:     {http.StatusServiceUnavailable, CodeUnavailable, TokenUnavailable, KeyErrUnavailable},
}

// storeFailure names a store failure for the caller: what happened, never
// the store's own words (they may name keys). ok is false for any other
// error.
func storeFailure(err error) (msg string, ok bool) {
	switch {
	case errors.Is(err, cluster.ErrStoreFull):
		return "the listener's store is out of disk space until an operator makes room", true
	case errors.Is(err, cluster.ErrStoreDamaged):
		return "the listener's store is damaged; an operator must restore it from a backup (see the listener log)", true
	case errors.Is(err, cluster.ErrStoreUnavailable):
		return "the listener cannot reach its store", true
	}
	return "", false
}

// retryAfter is the Retry-After of a 503, in seconds: the listener's store
// deadline, when the core names one.
func (s *Server) retryAfter() string {
	if c, ok := s.core.(interface{ StoreTimeout() time.Duration }); ok {
		if d := c.StoreTimeout(); d > 0 {
			return strconv.Itoa(int(d.Seconds() + 0.999))
		}
	}
	return "5"
}

// fail writes err in facade f's shape. Internal errors are logged with the
// request id and answered without their text.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, f facade, err error) {
	var e *apiError
	if !errors.As(err, &e) {
		e = errInternal(err)
	}
	if e.kind == kindInternal {
		if msg, ok := storeFailure(e.cause); ok {
			s.logger.Warn("admin request: store failed", "requestId", requestIDOf(r), "path", r.URL.Path, "err", e.cause)
			e = &apiError{kind: kindUnavailable, msg: msg}
		}
	}
	if e.kind == kindUnavailable {
		w.Header().Set("Retry-After", s.retryAfter())
	}
	if e.kind == kindInternal {
		s.logger.Error("admin request failed", "requestId", requestIDOf(r), "path", r.URL.Path, "err", e.cause)
		e = &apiError{kind: kindInternal, msg: "internal error; see the listener log for request " + requestIDOf(r)}
	}
	m := mappings[e.kind]
	status := m.status
	if e.retryAfter > 0 {
		retryAfterHeader(w, e.retryAfter)
	}
	if f == facadeCluster && e.kind == kindLimit {
		status = http.StatusConflict
	}
	switch f {
	case facadeTokens:
		body := TokenError{Code: m.token, Message: e.msg, RequestID: requestIDOf(r)}
		for _, fe := range e.fields {
			body.Details = append(body.Details, FieldError{fe.path, fe.msg})
		}
		writeJSON(w, status, map[string]TokenError{"error": body})
	case facadeKeys:
		writeJSON(w, status, map[string][]KeyError{"errors": keyErrors(e, m.key)})
	default:
		p := Problem{
			Type: problemTypeBase + m.code, Title: http.StatusText(status), Status: status, Detail: e.msg,
			Instance: r.URL.Path, RequestID: requestIDOf(r), Code: m.code,
		}
		for _, fe := range e.fields {
			p.Errors = append(p.Errors, FieldError{fe.path, fe.msg})
		}
		w.Header().Set("Content-Type", problemContentType)
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(p)
	}
}

// keyErrors lists one entry per field problem, as the join-keys API does.
func keyErrors(e *apiError, code string) []KeyError {
	if len(e.fields) == 0 {
		ke := KeyError{Code: code, Message: e.msg, Param: e.param}
		if e.kind == kindLimit {
			ke.Extra = map[string]any{"limit": e.limit, "limitName": e.limitName}
		}
		return []KeyError{ke}
	}
	out := make([]KeyError, 0, len(e.fields))
	for _, fe := range e.fields {
		c := fe.code
		if c == "" {
			c = code
		}
		ke := KeyError{Code: c, Message: fe.msg}
		if e.param != "" {
			ke.Param = fe.path
		} else {
			ke.Path = fe.path
		}
		out = append(out, ke)
	}
	return out
}

func requestID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return "req-" + hex.EncodeToString(b)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
