package adminapi

import (
	"math"
	"mime"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/stratumjoin/stratum/internal/sourcelimit"
)

// Failed API keys are limited per source address: a burst of
// authFailBurst, then one more every authFailEvery. Past that every
// request from the source is answered 429 with Retry-After until the
// bucket refills, so guessing keys over HTTPS goes at 10 a minute.
const (
	authFailBurst = 10
	authFailEvery = 6 * time.Second
	// authFailSources bounds the sources tracked at once; past it, those
	// whose bucket is full again are forgotten.
	authFailSources = 16384
)

// authFailures holds each source's allowance of failed API keys.
type authFailures struct {
	sources sourcelimit.Sources
}

func sourceOf(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// blocked reports whether the source has spent its failed attempts, and
// how long until it may try again.
func (a *authFailures) blocked(src string, now time.Time) (time.Duration, bool) {
	tokens := a.sources.Tokens(src, now)
	if tokens >= 1 {
		return 0, false
	}
	return time.Duration((1 - tokens) * float64(authFailEvery)), true
}

// failed spends one of the source's failed attempts.
func (a *authFailures) failed(src string, now time.Time) {
	if !a.sources.Has(src) && a.sources.Len() >= authFailSources {
		a.sources.ForgetRefilled(now)
	}
	a.sources.Spend(src, now)
}

func errTooManyFailures(wait time.Duration) *apiError {
	return &apiError{kind: kindRateLimited, msg: "too many failed API keys from this address; try again later", retryAfter: wait}
}

// retryAfterHeader sets Retry-After in whole seconds, at least 1.
func retryAfterHeader(w http.ResponseWriter, d time.Duration) {
	w.Header().Set("Retry-After", strconv.Itoa(max(1, int(math.Ceil(d.Seconds())))))
}

// jsonBody refuses a request body that is not application/json: the API
// reads JSON only, and a form or text body is a caller's mistake (or a
// browser's cross-site form post) best named.
func jsonBody(r *http.Request) *apiError {
	if r.ContentLength == 0 && len(r.TransferEncoding) == 0 {
		return nil
	}
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != "application/json" {
		return &apiError{kind: kindMediaType, msg: "request bodies must be application/json"}
	}
	return nil
}
