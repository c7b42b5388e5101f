package agent

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"
)

// Metrics is the agent's Prometheus instrumentation: what the state
// directory says (read at each scrape, so it is never stale) and counts of
// what the service loop did. Wire Retried and Renewed into RunConfig's
// OnRetry and OnRenewal.
//
// It writes the text exposition format itself: seven series do not need
// the Prometheus client library, whose package initialisation (with
// protobuf's) every `stratum-agent` process would pay at start, one-shot
// joins included (BenchmarkOneShotJoin).
type Metrics struct {
	st       State
	retries  atomic.Uint64
	renewed  atomic.Uint64
	failures atomic.Uint64
}

// NewMetrics returns the metrics of the agent whose state is in stateDir.
func NewMetrics(stateDir string) *Metrics {
	return &Metrics{st: State{Dir: stateDir}}
}

// Retried counts one transient failure (RunConfig.OnRetry).
func (m *Metrics) Retried(int, time.Duration, error) { m.retries.Add(1) }

// Renewed counts one renewal attempt (RunConfig.OnRenewal).
func (m *Metrics) Renewed(err error) {
	if err != nil {
		m.failures.Add(1)
		return
	}
	m.renewed.Add(1)
}

// Serve serves /metrics on ln until ctx ends.
func (m *Metrics) Serve(ctx context.Context, ln net.Listener, logger *slog.Logger) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		_, _ = w.Write(m.exposition())
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) && logger != nil {
		logger.Warn("metrics server", "err", err)
	}
}

// exposition is the text format of every series, families sorted by name
// as the Prometheus client sorts them.
func (m *Metrics) exposition() []byte {
	var b bytes.Buffer
	family := func(name, typ, help string) {
		b.WriteString("# HELP " + name + " " + help + "\n# TYPE " + name + " " + typ + "\n")
	}
	sample := func(name, labels string, v float64) {
		b.WriteString(name + labels + " " + strconv.FormatFloat(v, 'g', -1, 64) + "\n")
	}
	id, ok, err := m.st.Identity()
	joined := err == nil && ok
	if joined {
		family("stratum_agent_certificate_expiry_timestamp_seconds", "gauge", "When the node certificate expires (Unix time).")
		sample("stratum_agent_certificate_expiry_timestamp_seconds", "", float64(id.NotAfter.Unix()))
		family("stratum_agent_certificate_renew_after_timestamp_seconds", "gauge", "When the listener suggested renewing (Unix time).")
		sample("stratum_agent_certificate_renew_after_timestamp_seconds", "", float64(id.RenewAfter.Unix()))
	}
	family("stratum_agent_joined", "gauge", "1 when the state directory holds a node identity.")
	sample("stratum_agent_joined", "", map[bool]float64{false: 0, true: 1}[joined])
	if joined && id.LastRenewal != nil {
		family("stratum_agent_last_renewal_timestamp_seconds", "gauge", "When the certificate was last renewed (Unix time; absent before the first renewal).")
		sample("stratum_agent_last_renewal_timestamp_seconds", "", float64(id.LastRenewal.Unix()))
	}
	if joined {
		family("stratum_agent_renewal_failing", "gauge", "1 when the last renewal attempt failed (its error is in `stratum-agent status`).")
		sample("stratum_agent_renewal_failing", "", map[bool]float64{false: 0, true: 1}[id.LastError != ""])
	}
	family("stratum_agent_renewals_total", "counter", "Renewal attempts by outcome (renewed, failed).")
	sample("stratum_agent_renewals_total", `{outcome="failed"}`, float64(m.failures.Load()))
	sample("stratum_agent_renewals_total", `{outcome="renewed"}`, float64(m.renewed.Load()))
	family("stratum_agent_retries_total", "counter", "Joins and renewals that failed transiently and are tried again after a backoff.")
	sample("stratum_agent_retries_total", "", float64(m.retries.Load()))
	return b.Bytes()
}
