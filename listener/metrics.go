package listener

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/quic-go/quic-go"

	"github.com/stratumjoin/stratum/internal/cluster"
	"github.com/stratumjoin/stratum/internal/wire"
)

// EventProofFailed is written once per secret and minute in which proofs
// of it failed (a wrong code, or a guess): the count and the remote
// addresses, never what was sent.
const EventProofFailed = "security.join.proof-failed"

// Join outcomes, the "outcome" label of stratum_listener_joins_total.
const (
	outcomeJoined      = "joined"
	outcomePending     = "pending"
	outcomeRefused     = "refused"
	outcomeFailedProof = "failed_proof"
	outcomeAbandoned   = "abandoned" // the agent went away, or a protocol error
	outcomeError       = "error"     // the listener failed (store)
)

// metrics is the listener's Prometheus instrumentation (docs/operations.md
// lists every series). Each Listener has its own registry, so tests can
// run several.
type metrics struct {
	reg          *prometheus.Registry
	joins        *prometheus.CounterVec
	refusals     *prometheus.CounterVec
	burns        *prometheus.CounterVec
	attempts     *prometheus.CounterVec
	inFlight     prometheus.Gauge
	phase        *prometheus.HistogramVec
	pending      prometheus.Gauge
	renewals     *prometheus.CounterVec
	storeSeconds *prometheus.HistogramVec
	storeErrors  *prometheus.CounterVec
	conns        *prometheus.CounterVec
	retries      prometheus.Counter
	// handshakeFailures are handshakes that never completed, and Retries
	// never answered (addresscheck.go)
	handshakeFailures prometheus.Counter
	dropped           prometheus.Counter
	backlog           prometheus.Gauge
	backlogBytes      prometheus.Gauge
	held              prometheus.Counter
	letIn             prometheus.Counter
}

func newMetrics(active func() float64) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		joins: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stratum_listener_joins_total", Help: "Join exchanges by outcome and secret kind (code, token, key; unknown for a locator no secret has).",
		}, []string{"outcome", "kind"}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stratum_listener_refusals_total", Help: "Joins and renewals refused after a proof, by refusal code.",
		}, []string{"code"}),
		burns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stratum_listener_burns_total", Help: "Secrets burned by too many unproven attempts, by kind.",
		}, []string{"kind"}),
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stratum_listener_attempts_total", Help: "Started join exchanges, by whether they were counted against a live secret.",
		}, []string{"counted"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "stratum_listener_joins_in_flight", Help: "Join exchanges in progress.",
		}),
		phase: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "stratum_listener_exchange_phase_seconds", Help: "Time spent in each phase of a join: hello (first frame), challenge (count and KE2), proof (the agent's key stretching and KE3), prove (checks and issuing).",
			Buckets: []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"phase"}),
		pending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "stratum_listener_approvals_pending", Help: "Joins this listener holds open while they wait for an administrator's approval.",
		}),
		renewals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stratum_listener_renewals_total", Help: "Certificate renewals by outcome (renewed, refused, error).",
		}, []string{"outcome"}),
		storeSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "stratum_listener_store_seconds", Help: "Latency of the store transactions of joins and renewals, by operation.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}, []string{"op"}),
		storeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stratum_listener_store_errors_total", Help: "Store operations of joins and renewals that failed, by operation.",
		}, []string{"op"}),
		conns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stratum_listener_connections_total", Help: "QUIC connections by result: accepted, or refused at --max-connections.",
		}, []string{"result"}),
		retries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "stratum_listener_quic_retries_total", Help: "QUIC Retry packets asked of new connections: of sources opening connections faster than --retry-above, and of every source while handshakes fail (stratum_listener_address_checks).",
		}),
		handshakeFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "stratum_listener_handshake_failures_total", Help: "Admitted connections whose handshake never completed, and, while stratum_listener_address_checks is 1, Retries not answered within 10 s: 16 within 10 s make every new connection prove its address for a minute.",
		}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "stratum_listener_initials_dropped_total", Help: "QUIC Initial packets of new connections dropped unanswered because the backlog of connections waiting for room (--backlog) was full (each agent sends its Initial again).",
		}),
		backlog: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "stratum_listener_backlog_connections", Help: "New connections waiting in the backlog for room under --max-active and --max-handshakes.",
		}),
		backlogBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "stratum_listener_backlog_bytes", Help: "Bytes of the datagrams the backlog holds for the connections waiting in it.",
		}),
		held: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "stratum_listener_backlog_held_total", Help: "New connections that waited in the backlog for room.",
		}),
		letIn: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "stratum_listener_backlog_let_in_total", Help: "New connections let in from the backlog, oldest first, as room freed.",
		}),
	}
	m.reg.MustRegister(m.joins, m.refusals, m.burns, m.attempts, m.inFlight, m.phase, m.pending, m.renewals, m.storeSeconds, m.storeErrors, m.conns, m.retries, m.handshakeFailures, m.dropped, m.backlog, m.backlogBytes, m.held, m.letIn,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "stratum_listener_connections", Help: "QUIC connections being served."}, active),
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	for _, o := range []string{outcomeJoined, outcomePending, outcomeRefused, outcomeFailedProof, outcomeAbandoned, outcomeError} {
		for _, k := range []string{cluster.KindCode, cluster.KindToken, cluster.KindKey} {
			m.joins.WithLabelValues(o, k)
		}
	}
	for _, k := range []string{cluster.KindCode, cluster.KindToken, cluster.KindKey} {
		m.burns.WithLabelValues(k)
	}
	for _, o := range []string{"renewed", "refused", "error"} {
		m.renewals.WithLabelValues(o)
	}
	// every series exists from the start, so rate() and alerts see zeros
	m.attempts.WithLabelValues("true")
	m.attempts.WithLabelValues("false")
	for _, p := range []string{"hello", "challenge", "proof", "prove"} {
		m.phase.WithLabelValues(p)
	}
	for _, op := range []string{"begin_attempt", "prove", "renew"} {
		m.storeSeconds.WithLabelValues(op)
		m.storeErrors.WithLabelValues(op)
	}
	m.conns.WithLabelValues("accepted")
	m.conns.WithLabelValues("refused")
	return m
}

// storeOp observes one store operation of the join or renewal path.
func (m *metrics) storeOp(op string, start time.Time, err error) {
	m.storeSeconds.WithLabelValues(op).Observe(time.Since(start).Seconds())
	if err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, cluster.ErrBusy) {
		m.storeErrors.WithLabelValues(op).Inc()
	}
}

func (m *metrics) renewal(res *wire.Result, err error) {
	switch {
	case res != nil && res.Status == wire.StatusRefused:
		m.renewals.WithLabelValues("refused").Inc()
		m.refusals.WithLabelValues(res.Code).Inc()
	case res != nil && res.Status == wire.StatusJoined:
		m.renewals.WithLabelValues("renewed").Inc()
	case err != nil:
		m.renewals.WithLabelValues("error").Inc()
	}
}

// joinReport follows one join exchange for the metrics and the logs.
type joinReport struct {
	l       *Listener
	remote  string
	kind    string
	outcome string
	code    string
	mark    time.Time
}

// startJoin begins the report of a join exchange; end closes it.
func (l *Listener) startJoin(ctx context.Context) *joinReport {
	l.metrics.inFlight.Inc()
	return &joinReport{l: l, remote: remoteAddr(ctx), kind: "unknown", mark: time.Now()}
}

// phase ends the named phase of the exchange.
func (r *joinReport) phase(name string) {
	now := time.Now()
	r.l.metrics.phase.WithLabelValues(name).Observe(now.Sub(r.mark).Seconds())
	r.mark = now
}

// attempt records how the exchange's start was counted.
func (r *joinReport) attempt(att cluster.Attempt) {
	if att.Secret != nil {
		r.kind = att.Secret.Kind
	}
	r.l.metrics.attempts.WithLabelValues(fmt.Sprint(att.Counted)).Inc()
	if att.Burned {
		r.l.metrics.burns.WithLabelValues(r.kind).Inc()
	}
}

// result records the Result frame that ends the exchange.
func (r *joinReport) result(res *wire.Result) {
	switch res.Status {
	case wire.StatusJoined:
		r.outcome = outcomeJoined
	case wire.StatusPending:
		r.outcome = outcomePending
	default:
		r.outcome, r.code = outcomeRefused, res.Code
		r.l.metrics.refusals.WithLabelValues(res.Code).Inc()
	}
}

// failedProof records a proof that did not verify: counted, logged at
// info and aggregated into an event per secret and minute.
func (r *joinReport) failedProof(att cluster.Attempt) {
	r.outcome = outcomeFailedProof
	id := ""
	if att.Secret != nil {
		id = att.Secret.ID
	}
	r.l.logger.Info("join proof failed", "secretId", id, "kind", r.kind, "remote", r.remote)
	r.l.proofFailures.add(r.l, id, r.kind, r.remote)
}

func (r *joinReport) end(code wire.CloseCode, err error) {
	m := r.l.metrics
	m.inFlight.Dec()
	if r.outcome == "" {
		r.outcome = outcomeAbandoned
		if code == wire.CloseInternal {
			r.outcome = outcomeError
		}
	}
	m.joins.WithLabelValues(r.outcome, r.kind).Inc()
	switch {
	case r.outcome == outcomeRefused && r.code == wire.CodeRateLimited:
		// logged once per source and window (warnOverBudget)
	case r.outcome == outcomeRefused:
		r.l.logger.Info("join refused", "code", r.code, "kind", r.kind, "remote", r.remote)
	case r.outcome == outcomeError:
		r.l.logger.Warn("join failed", "err", err, "kind", r.kind, "remote", r.remote)
	case err != nil && r.outcome != outcomeFailedProof:
		r.l.logger.Debug("join ended", "err", err, "remote", r.remote)
	}
}

type remoteKey struct{}

func withRemote(ctx context.Context, addr net.Addr) context.Context {
	return context.WithValue(ctx, remoteKey{}, addr.String())
}

func remoteAddr(ctx context.Context) string {
	s, _ := ctx.Value(remoteKey{}).(string)
	return s
}

// proofFailures aggregates failed proofs per secret and minute: the first
// of a minute is recorded at once (so a wrong code shows up while the
// operator looks), the rest when the minute ends.
type proofFailures struct {
	mu   sync.Mutex
	open map[string]*failureWindow // secret id ("" for unknown locators)
}

type failureWindow struct {
	kind    string
	start   time.Time
	count   int // failures not yet recorded
	remotes map[string]bool
}

// window is how long failures of one secret are gathered into one event.
const failureWindowLen = time.Minute

func (p *proofFailures) add(l *Listener, id, kind, remote string) {
	now := l.now()
	p.mu.Lock()
	if p.open == nil {
		p.open = map[string]*failureWindow{}
	}
	w, ok := p.open[id]
	if ok && now.Sub(w.start) < failureWindowLen {
		w.count++
		w.remotes[remote] = true
		p.mu.Unlock()
		return
	}
	p.open[id] = &failureWindow{kind: kind, start: now, remotes: map[string]bool{}}
	p.mu.Unlock()
	if ok && w.count > 0 {
		l.recordFailures(id, w)
	}
	l.recordFailures(id, &failureWindow{kind: kind, start: now, count: 1, remotes: map[string]bool{remote: true}})
}

// flush records the windows that have ended (all of them when all is set).
func (p *proofFailures) flush(l *Listener, all bool) {
	now := l.now()
	p.mu.Lock()
	var done []struct {
		id string
		w  *failureWindow
	}
	for id, w := range p.open {
		if all || now.Sub(w.start) >= failureWindowLen {
			delete(p.open, id)
			if w.count > 0 {
				done = append(done, struct {
					id string
					w  *failureWindow
				}{id, w})
			}
		}
	}
	p.mu.Unlock()
	for _, d := range done {
		l.recordFailures(d.id, d.w)
	}
}

func (l *Listener) recordFailures(id string, w *failureWindow) {
	remotes := make([]string, 0, len(w.remotes))
	for r := range w.remotes {
		remotes = append(remotes, r)
	}
	sort.Strings(remotes)
	fields := map[string]any{"kind": w.kind, "count": w.count, "remoteAddrs": strings.Join(remotes, " "), "since": w.start.UTC().Format(time.RFC3339)}
	if id != "" {
		fields["id"] = id
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := l.cluster.Record(ctx, EventProofFailed, cluster.SystemActor, fields); err != nil {
		l.logger.Warn("record failed proofs", "err", err)
	}
}

// runFailureFlush records ended windows every few seconds until ctx ends,
// then the rest.
func (l *Listener) runFailureFlush(ctx context.Context) {
	every(ctx, 5*time.Second, func() { l.proofFailures.flush(l, false) })
	l.proofFailures.flush(l, true)
}

// Ready reports whether the listener can serve joins: its keys are loaded
// and its store answers. Config.StoreHealth, when set, replaces the store probe
// (a store that tracks its own health can answer without a round trip).
func (l *Listener) Ready(ctx context.Context) error {
	l.mu.RLock()
	loaded := l.ca != nil && l.opaque != nil
	l.mu.RUnlock()
	if !loaded {
		return errors.New("keys not loaded")
	}
	// a store damaged under a transaction is not ready, even if a probe
	// of one key still reads
	if err := l.Healthy(); err != nil {
		return fmt.Errorf("store damaged: %w", err)
	}
	check := l.cfg.StoreHealth
	if check == nil {
		check = func(ctx context.Context) error {
			_, err := l.store.Get(ctx, "health")
			return err
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := check(ctx); err != nil {
		return fmt.Errorf("store unreachable: %w", err)
	}
	return nil
}

// serveMetrics serves /metrics, /healthz and /readyz on the metrics
// listener until ctx ends.
func (l *Listener) serveMetrics(ctx context.Context, ln net.Listener) {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(l.metrics.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if err := l.Ready(r.Context()); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		l.logger.Warn("metrics server", "err", err)
	}
}

// MetricsAddr is the address of the metrics listener once Run serves it.
func (l *Listener) MetricsAddr() net.Addr {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.metricsAddr
}

// write sends the Result that ends the exchange and records it.
func (r *joinReport) write(str Stream, res *wire.Result) error {
	r.result(res)
	return wire.Write(str, res)
}

// agentRefusedKE2 reports whether the agent closed the connection because
// the Challenge did not verify under its secret (a wrong code): it closes
// with wire.CloseNotProof instead of sending a Proof.
func agentRefusedKE2(err error) bool {
	var ae *quic.ApplicationError
	return errors.As(err, &ae) && ae.Remote && wire.CloseCode(ae.ErrorCode) == wire.CloseNotProof
}

// watchAdmission reports the handshakes in progress and whether every new
// connection must prove its address now (1 or 0).
func (m *metrics) watchAdmission(handshakes, checks func() float64) {
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "stratum_listener_handshakes", Help: "Admitted connections whose handshake is in progress (at most --max-handshakes).",
	}, handshakes), prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "stratum_listener_address_checks", Help: "1 while every new connection must prove its address with a QUIC Retry, because handshakes fail (stratum_listener_handshake_failures_total).",
	}, checks))
}
