package adminapi

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net/http"
)

// FieldError is one field's problem (seed 004 FieldError).
type FieldError struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

// Problem is seed 004's application/problem+json error.
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

// Problem codes of the cluster admin routes.
const (
	CodeInvalidInput   = "INVALID_INPUT"
	CodeNotFound       = "NOT_FOUND"
	CodeForbidden      = "FORBIDDEN"
	CodeUnauthorized   = "UNAUTHORIZED"
	CodeLimitExceeded  = "LIMIT_EXCEEDED"
	CodeInvalidState   = "INVALID_STATE"
	CodeInternal       = "INTERNAL"
	CodeMethod         = "METHOD_NOT_ALLOWED"
	problemTypeBase    = "https://stratum.dev/problems/"
	problemContentType = "application/problem+json"
)

func requestID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return "req-" + hex.EncodeToString(b)
}

func writeProblem(w http.ResponseWriter, r *http.Request, status int, code, detail string, fields ...FieldError) {
	p := Problem{
		Type:      problemTypeBase + code,
		Title:     http.StatusText(status),
		Status:    status,
		Detail:    detail,
		Instance:  r.URL.Path,
		RequestID: requestIDOf(r),
		Code:      code,
		Errors:    fields,
	}
	w.Header().Set("Content-Type", problemContentType)
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(p)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
