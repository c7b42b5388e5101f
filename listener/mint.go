package listener

import (
	"context"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	"github.com/stratumjoin/stratum/internal/cluster"
	"github.com/stratumjoin/stratum/internal/joincode"
	"github.com/stratumjoin/stratum/internal/pake"
	"github.com/stratumjoin/stratum/pki"
)

// Mint stores a new join secret under the current CA: the listener fills
// in the OPAQUE record, the CA fingerprint, the endpoint and the key
// stretching parameters. The returned secret is shown once and forgotten.
func (l *Listener) Mint(ctx context.Context, spec cluster.SecretSpec) (*cluster.Secret, joincode.Secret, error) {
	_, fp := l.CA()
	rootFP, err := pki.ParseFingerprint(fp)
	if err != nil {
		return nil, joincode.Secret{}, err
	}
	spec.Secret.CAFingerprint = fp
	// Key stretching by entropy (docs/secrets.md): a join code's 40 secret
	// bits need Argon2id against whoever holds the store and the keys; a
	// token's or key's 128 bits and more need none. The parameters stay in
	// the record, so a secret minted under others keeps working.
	spec.Secret.KSF = l.ksfFor(spec.Secret.Kind == cluster.KindCode)
	if spec.Secret.Kind == cluster.KindCode {
		defer l.returnKSFMemory()
	}
	if spec.Secret.Endpoint == "" {
		spec.Secret.Endpoint = l.Endpoint()
		eps, err := l.Endpoints(ctx)
		if err != nil {
			return nil, joincode.Secret{}, err
		}
		if len(eps) > 1 {
			spec.Secret.Endpoints = eps
		}
	}
	kind := spec.Secret.Kind
	spec.Mint = func(locator string) (joincode.Secret, []byte, error) {
		var sec joincode.Secret
		var err error
		switch kind {
		case cluster.KindCode:
			sec, err = joincode.NewCode(locator)
		case cluster.KindToken:
			sec, err = joincode.NewToken(locator)
		default:
			sec, err = joincode.NewKey(locator)
		}
		if err != nil {
			return sec, nil, err
		}
		rec, err := l.opaque.Mint(sec.Locator, sec.Password(), rootFP[:], spec.Secret.KSF)
		return sec, rec, err
	}
	return l.cluster.Mint(ctx, spec)
}

// ksfIdle is how long after the last code mint the listener hands the
// Argon2id memory back to the OS. Freeing it after every mint would cost a
// full collection per mint; after a pause it costs one per burst.
const ksfIdle = time.Second

// returnKSFMemory schedules the return of the KSF's memory once code
// mints pause for ksfIdle.
func (l *Listener) returnKSFMemory() { l.ksfMem.schedule() }

// memReturner hands freed heap back to the OS once, after a pause, and
// again until what others hold of it has gone (scheduleHeld).
type memReturner struct {
	mu sync.Mutex
	t  *time.Timer
	// heldUntil is when others let go of the last of what was scheduled
	heldUntil time.Time
	// before, when set, runs just before the memory is returned
	before func()
}

func (m *memReturner) schedule() { m.scheduleHeld(0) }

// scheduleHeld is schedule for something another part goes on holding
// for held: quic-go keeps a closed connection's IDs, and a timer, for
// three probe timeouts, up to tens of seconds for connections that waited
// on a busy peer. The spans those pin are free only then, so until held
// has passed (and a pause after it) the memory is returned again every
// heldReturnEvery.
func (m *memReturner) scheduleHeld(held time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if until := time.Now().Add(held); until.After(m.heldUntil) {
		m.heldUntil = until
	}
	if m.t != nil {
		m.t.Reset(ksfIdle)
		return
	}
	m.t = time.AfterFunc(ksfIdle, m.ret)
}

func (m *memReturner) ret() {
	if m.before != nil {
		m.before()
	}
	debug.FreeOSMemory()
	m.mu.Lock()
	defer m.mu.Unlock()
	if wait := time.Until(m.heldUntil); wait > 0 {
		m.t.Reset(min(wait+ksfIdle, heldReturnEvery))
	}
}

// heldReturnEvery spaces the returns while others hold memory: each is a
// full collection of what is by then a small heap.
const heldReturnEvery = 10 * time.Second

// Endpoint is the first endpoint agents are told to dial.
func (l *Listener) Endpoint() string {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.settings.Endpoints[0]
}

// Endpoints lists every endpoint of the cluster, this listener's first:
// those the listeners of the store recorded, when it is one of a cluster.
func (l *Listener) Endpoints(ctx context.Context) ([]string, error) {
	l.mu.RLock()
	out := slices.Clone(l.settings.Endpoints)
	l.mu.RUnlock()
	if l.kek == nil {
		return out, nil
	}
	all, err := l.cluster.Endpoints(ctx)
	if err != nil {
		return nil, err
	}
	for _, ep := range all {
		if !slices.Contains(out, ep) {
			out = append(out, ep)
		}
	}
	return out, nil
}

// SetEndpoint overrides the endpoint minted secrets name (tests listening
// on an ephemeral port).
func (l *Listener) SetEndpoint(ep string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.settings.Endpoints = append([]string{ep}, l.settings.Endpoints[1:]...)
}

// TrustDomain is the cluster's SPIFFE trust domain.
func (l *Listener) TrustDomain() string { return l.settings.TrustDomain }

// ksfFor is the key stretching a new secret gets: a join code's (code),
// or a token's or key's (none). An unknown locator's Challenge names the
// one its shape would have, so its size tells nothing.
func (l *Listener) ksfFor(code bool) pake.KSFParams {
	if code {
		return l.settings.KSF
	}
	return pake.NoKSF
}
