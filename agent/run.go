package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime/debug"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/stratumjoin/stratum/internal/joincode"
	"github.com/stratumjoin/stratum/internal/wire"
)

// Clock is the time source of the service loop; tests inject a fake one.
type Clock interface {
	Now() time.Time
	After(d time.Duration) <-chan time.Time
}

type realClock struct{}

func (realClock) Now() time.Time                         { return time.Now() }
func (realClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// Notifier receives the service's state changes (sd_notify in production).
type Notifier interface {
	Ready(status string) error
	Status(status string) error
}

// RunConfig wires the service loop.
type RunConfig struct {
	StateDir string
	// Endpoint, then Endpoints, are the listeners a join may go through.
	Endpoint  string
	Endpoints []string
	// Secret returns the join secret when the node has no identity yet.
	Secret func() (joincode.Secret, error)
	// Facts collects the hardware identity to claim.
	Facts         func(ctx context.Context) (wire.Facts, error)
	CAFingerprint string
	Notifier      Notifier
	Clock         Clock
	Logger        *slog.Logger
	// Rand gives jitter in [0,1); tests may fix it.
	Rand func() float64
	// BackoffBase and BackoffMax bound the wait between transient failures
	// (default 1s and 4m); each wait is drawn uniformly from [0, min(max,
	// base*2^n)] ("full jitter"), so a fleet restarted together spreads out.
	BackoffBase, BackoffMax time.Duration
	// JoinConfig and RenewConfig, when set, adjust each join or renewal
	// before it runs (tests shorten timeouts or route the dial).
	JoinConfig  func(*JoinConfig)
	RenewConfig func(*RenewConfig)
	// OnRetry, when set, is told of each wait before a join or renewal is
	// tried again: attempt counts from 0, err is what failed.
	OnRetry func(attempt int, wait time.Duration, err error)
	// OnRenewal, when set, is told how each renewal attempt ended.
	OnRenewal func(err error)
	// Watchdog, when set with a positive WatchdogInterval, is called that
	// often by the service loop itself (WATCHDOG=1 in production): from its
	// waits, and while it waits for a join or renewal it started. The pings
	// come from no goroutine of their own, so a loop that stops turning
	// (a deadlock, a stopped process) stops them and systemd restarts it.
	Watchdog         func()
	WatchdogInterval time.Duration
	lastPing         time.Time
	// TPM locates the TPM to keep the node key in (docs/tpm.md); "" for
	// a key file. A node that joined with a TPM renews with it.
	TPM string
}

// ErrNeedsNewCode is returned when the listener refuses to renew the
// node's certificate for good (it was revoked, or the listener no longer
// knows it): only a join with a new code gives the machine an identity
// again. The agent never falls back to the code it joined with, so a
// revoked node stays out.
var ErrNeedsNewCode = errors.New("the listener no longer accepts this node: join it again with a new code")

func (c *RunConfig) defaults() {
	if c.Clock == nil {
		c.Clock = realClock{}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Rand == nil {
		c.Rand = rand.Float64
	}
	if c.BackoffBase == 0 {
		c.BackoffBase = time.Second
	}
	if c.BackoffMax == 0 {
		c.BackoffMax = 4 * time.Minute
	}
	if c.Notifier == nil {
		c.Notifier = nopNotifier{}
	}
}

type nopNotifier struct{}

func (nopNotifier) Ready(string) error  { return nil }
func (nopNotifier) Status(string) error { return nil }

// Run keeps the node joined until ctx ends: it joins if needed (retrying
// transient failures with jittered exponential backoff), says READY once
// it holds a valid identity, and renews at 2/3 of each certificate's life
// with jitter. A permanent refusal ends it with an error; the end of ctx
// ends it with nil, whatever it was doing.
func Run(ctx context.Context, cfg RunConfig) error {
	cfg.defaults()
	err := run(ctx, &cfg)
	if ctx.Err() != nil {
		return nil
	}
	return err
}

func run(ctx context.Context, cfg *RunConfig) error {
	st := State{Dir: cfg.StateDir}
	id, joined, err := st.Identity()
	if err != nil {
		return err
	}
	if !joined {
		if id, err = runJoin(ctx, cfg); err != nil {
			return err
		}
		// The key stretching's memory (64 MiB with the default Argon2id
		// parameters) is garbage now: give it back to the system rather
		// than carry it in an idle service until the next forced GC.
		debug.FreeOSMemory()
	} else if !cfg.Clock.Now().Before(id.NotAfter) {
		// expired while the machine was off: the listener renews it if it
		// still knows the node
		cfg.status("certificate expired at " + id.NotAfter.UTC().Format(time.RFC3339) + "; renewing")
		if id, err = runRenew(ctx, cfg); err != nil {
			return err
		}
	}
	_ = cfg.Notifier.Ready(joinedStatus(id))
	cfg.Logger.Info("state", "status", joinedStatus(id))
	for {
		now := cfg.Clock.Now()
		wait := renewTime(id, cfg.Rand()).Sub(now)
		if wait <= 0 {
			// Overdue (the agent was stopped past its renewal time): a
			// fleet restarted together must not renew in lockstep either.
			wait = overdueWait(id, now, cfg.Rand())
		}
		cfg.Logger.Info("next renewal", "at", now.Add(wait).UTC().Format(time.RFC3339), "nodeId", id.NodeID)
		if err := cfg.sleep(ctx, wait); err != nil {
			return err
		}
		cfg.status("renewing")
		if id, err = runRenew(ctx, cfg); err != nil {
			return err
		}
		cfg.status(joinedStatus(id))
	}
}

func (c *RunConfig) status(s string) {
	c.Logger.Info("state", "status", s)
	_ = c.Notifier.Status(s)
}

func joinedStatus(id Identity) string {
	return fmt.Sprintf("joined as %s until %s", id.NodeID, id.NotAfter.UTC().Format(time.RFC3339))
}

// renewTime is 2/3 of the certificate's life, moved by up to ±1/12 of the
// life so that nodes joined together do not renew together.
func renewTime(id Identity, r float64) time.Time {
	life := id.NotAfter.Sub(id.JoinedAt)
	if id.LastRenewal != nil {
		life = id.NotAfter.Sub(*id.LastRenewal)
	}
	start := id.NotAfter.Add(-life)
	jitter := time.Duration((r*2 - 1) * float64(life) / 12)
	return start.Add(life*2/3 + jitter)
}

// overdueWait spreads the renewals of agents that start past their renewal
// time: up to a minute, and never more than a quarter of what is left of
// the certificate (nothing once it has expired).
func overdueWait(id Identity, now time.Time, r float64) time.Duration {
	spread := min(time.Minute, id.NotAfter.Sub(now)/4)
	if spread <= 0 {
		return 0
	}
	return time.Duration(r * float64(spread))
}

// Backoff returns the n-th (0-based) wait: uniform in [0, min(max, base*2^n)].
func Backoff(n int, base, max time.Duration, r float64) time.Duration {
	ceil := max
	if n < 32 {
		if d := base << n; d > 0 && d < max {
			ceil = d
		}
	}
	return time.Duration(r * float64(ceil))
}

// sleep waits d or until ctx ends, pinging the watchdog meanwhile.
func (c *RunConfig) sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	wake := c.Clock.After(d)
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-wake:
			return nil
		case <-c.tick():
			c.ping()
		}
	}
}

// tick fires when the next watchdog ping is due, or never when there is
// none. The pings keep one schedule across waits: a wait that starts its
// own interval afresh could leave almost two intervals between pings.
func (c *RunConfig) tick() <-chan time.Time {
	if c.Watchdog == nil || c.WatchdogInterval <= 0 {
		return nil
	}
	return c.Clock.After(c.lastPing.Add(c.WatchdogInterval).Sub(c.Clock.Now()))
}

// ping sends one watchdog ping and starts the next interval.
func (c *RunConfig) ping() {
	c.lastPing = c.Clock.Now()
	c.Watchdog()
}

// await runs one join or renewal while the service loop goes on pinging
// the watchdog, and returns what it returned. The step ends when ctx does.
func await[T any](ctx context.Context, c *RunConfig, step func() (T, error)) (T, error) {
	if c.Watchdog == nil || c.WatchdogInterval <= 0 {
		return step()
	}
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	go func() {
		v, err := step()
		done <- result{v, err}
	}()
	for {
		select {
		case r := <-done:
			return r.v, r.err
		case <-c.tick():
			c.ping()
		}
	}
}

// transient reports whether an error is worth retrying.
func transient(err error) bool {
	var u *UnreachableError
	var r *RefusedError
	return errors.As(err, &u) || (errors.As(err, &r) && r.Retryable())
}

func runJoin(ctx context.Context, cfg *RunConfig) (Identity, error) {
	if cfg.Secret == nil {
		return Identity{}, errors.New("not joined and no join code given")
	}
	sec, err := cfg.Secret()
	if err != nil {
		return Identity{}, err
	}
	for attempt := 0; ; attempt++ {
		cfg.status("joining " + cfg.Endpoint)
		var facts wire.Facts
		if cfg.Facts != nil {
			if facts, err = await(ctx, cfg, func() (wire.Facts, error) { return cfg.Facts(ctx) }); err != nil {
				return Identity{}, err
			}
		}
		jc := JoinConfig{
			StateDir: cfg.StateDir, Endpoint: cfg.Endpoint, Endpoints: cfg.Endpoints, Secret: sec, CAFingerprint: cfg.CAFingerprint, Facts: facts, TPM: cfg.TPM,
			Logger: cfg.Logger, Now: cfg.Clock.Now,
			OnPending: func(p Pending) { cfg.status(pendingStatus(p)) },
		}
		if cfg.JoinConfig != nil {
			cfg.JoinConfig(&jc)
		}
		j, err := await(ctx, cfg, func() (*Joined, error) { return Join(ctx, jc) })
		if err == nil {
			return j.Identity, nil
		}
		if ctx.Err() != nil {
			return Identity{}, ctx.Err()
		}
		if !transient(err) {
			cfg.status("refused: " + err.Error())
			return Identity{}, err
		}
		if err := cfg.retry(ctx, "join", attempt, err); err != nil {
			return Identity{}, err
		}
	}
}

// BusyMax caps the wait after a listener turned the agent away for
// being busy: it refused the connection at its first packet (past its
// bound on everything in flight, or past --max-handshakes on a socket where
// it cannot drop the packet instead) or closed it for want of a slot. Such a refusal costs
// the listener microseconds, and it frees slots at the rate it serves, so
// waits that kept doubling to minutes would leave it idle while a herd's
// last machines sleep.
const BusyMax = 10 * time.Second

// Busy reports whether err is a listener turning the agent away for
// being busy.
func Busy(err error) bool {
	var te *quic.TransportError
	if errors.As(err, &te) && te.Remote && te.ErrorCode == quic.ConnectionRefused {
		return true
	}
	var ce *ClosedError
	return errors.As(err, &ce) && ce.Code == wire.CloseBusy
}

// RetryWait is the wait before retry n (0-based) after cause: the
// service's jittered backoff between base and max, capped at BusyMax when
// the listener was busy, and never shorter than a wait the listener named
// (JOIN_RATE_LIMITED), with jitter on top so a fleet told the same does
// not return together. rnd returns uniform values in [0, 1).
func RetryWait(n int, base, max time.Duration, rnd func() float64, cause error) time.Duration {
	if Busy(cause) {
		max = min(max, BusyMax)
	}
	wait := Backoff(n, base, max, rnd())
	var r *RefusedError
	if errors.As(cause, &r) && r.RetryAfter > 0 && wait < r.RetryAfter {
		wait = r.RetryAfter + time.Duration(rnd()*float64(r.RetryAfter)/4)
	}
	return wait
}

// retry reports a transient failure and waits before the next attempt.
func (c *RunConfig) retry(ctx context.Context, what string, attempt int, cause error) error {
	wait := RetryWait(attempt, c.BackoffBase, c.BackoffMax, c.Rand, cause)
	c.Logger.Warn(what+" failed, retrying", "err", cause, "in", wait, "attempt", attempt+1)
	_ = c.Notifier.Status(fmt.Sprintf("%s failed, retrying in %s: %v", what, wait.Round(time.Millisecond), cause))
	if c.OnRetry != nil {
		c.OnRetry(attempt, wait, cause)
	}
	return c.sleep(ctx, wait)
}

func runRenew(ctx context.Context, cfg *RunConfig) (Identity, error) {
	st := State{Dir: cfg.StateDir}
	for attempt := 0; ; attempt++ {
		rc := RenewConfig{StateDir: cfg.StateDir, Now: cfg.Clock.Now, TPM: cfg.TPM}
		if cfg.RenewConfig != nil {
			cfg.RenewConfig(&rc)
		}
		id, err := await(ctx, cfg, func() (Identity, error) { return Renew(ctx, rc) })
		if cfg.OnRenewal != nil && ctx.Err() == nil {
			cfg.OnRenewal(err)
		}
		if err == nil {
			return id, nil
		}
		if ctx.Err() != nil {
			return id, ctx.Err()
		}
		// Record the failure for `stratum-agent status`, over what is on
		// disk now: id may be empty when reading the state failed.
		if cur, ok, rerr := st.Identity(); rerr == nil && ok {
			cur.LastError = err.Error()
			if serr := st.saveIdentity(cur); serr != nil {
				cfg.Logger.Warn("record renewal error", "err", serr)
			}
		}
		// Only a refusal or this machine's own state stops the service:
		// anything else (the listener unreachable or busy, a broken
		// answer, a certificate this clock does not accept yet) is tried
		// again with backoff; the listener renews even an expired
		// certificate of a node it knows.
		var r *RefusedError
		var local *localError
		switch {
		case errors.As(err, &r) && (r.Code == wire.CodeNodeUnknown || r.Code == wire.CodeNodeRevoked || r.Code == wire.CodeCertInvalid || r.Code == wire.CodeCertExpired):
			cfg.status("refused: " + r.Message)
			return id, fmt.Errorf("%w: %w", ErrNeedsNewCode, err)
		case r != nil && !r.Retryable():
			cfg.status("refused: " + err.Error())
			return id, err
		case errors.As(err, &local):
			cfg.status("failed: " + err.Error())
			return id, err
		}
		if err := cfg.retry(ctx, "renewal", attempt, err); err != nil {
			return id, err
		}
	}
}

// pendingStatus is the STATUS= line of a join held for approval: the SAS
// is what the approver compares with `joins list` before approving.
func pendingStatus(p Pending) string {
	return fmt.Sprintf("waiting for approval of join %s; SAS %s", p.JoinID, p.SAS)
}
