package adminapi

import (
	"math"
	"mime"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"golang.org/x/time/rate"
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

type authFailures struct {
	mu sync.Mutex
	m  map[string]*rate.Limiter
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
	a.mu.Lock()
	defer a.mu.Unlock()
	lim := a.m[src]
	if lim == nil {
		return 0, false
	}
	tokens := lim.TokensAt(now)
	if tokens >= 1 {
		return 0, false
	}
	return time.Duration((1 - tokens) * float64(authFailEvery)), true
}

// failed spends one of the source's failed attempts.
func (a *authFailures) failed(src string, now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.m == nil {
		a.m = map[string]*rate.Limiter{}
	}
	lim := a.m[src]
	if lim == nil {
		if len(a.m) >= authFailSources {
			for k, l := range a.m {
				if l.TokensAt(now) >= authFailBurst {
					delete(a.m, k)
				}
			}
		}
		lim = rate.NewLimiter(rate.Every(authFailEvery), authFailBurst)
		a.m[src] = lim
	}
	lim.AllowN(now, 1)
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
