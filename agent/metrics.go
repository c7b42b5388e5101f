package agent

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Metrics is the agent's Prometheus instrumentation: what the state
// directory says (read at each scrape, so it is never stale) and counts of
// what the service loop did. Wire Retried and Renewed into RunConfig's
// OnRetry and OnRenewal.
type Metrics struct {
	reg      *prometheus.Registry
	retries  prometheus.Counter
	renewals *prometheus.CounterVec
}

// NewMetrics returns the metrics of the agent whose state is in stateDir.
func NewMetrics(stateDir string) *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		retries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "stratum_agent_retries_total", Help: "Joins and renewals that failed transiently and are tried again after a backoff.",
		}),
		renewals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stratum_agent_renewals_total", Help: "Renewal attempts by outcome (renewed, failed).",
		}, []string{"outcome"}),
	}
	for _, o := range []string{"renewed", "failed"} {
		m.renewals.WithLabelValues(o)
	}
	m.reg.MustRegister(m.retries, m.renewals, stateCollector{State{Dir: stateDir}})
	return m
}

// Retried counts one transient failure (RunConfig.OnRetry).
func (m *Metrics) Retried(int, time.Duration, error) { m.retries.Inc() }

// Renewed counts one renewal attempt (RunConfig.OnRenewal).
func (m *Metrics) Renewed(err error) {
	if err != nil {
		m.renewals.WithLabelValues("failed").Inc()
		return
	}
	m.renewals.WithLabelValues("renewed").Inc()
}

// Serve serves /metrics on ln until ctx ends.
func (m *Metrics) Serve(ctx context.Context, ln net.Listener, logger *slog.Logger) {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) && logger != nil {
		logger.Warn("metrics server", "err", err)
	}
}

var (
	descJoined      = prometheus.NewDesc("stratum_agent_joined", "1 when the state directory holds a node identity.", nil, nil)
	descExpiry      = prometheus.NewDesc("stratum_agent_certificate_expiry_timestamp_seconds", "When the node certificate expires (Unix time).", nil, nil)
	descRenewAfter  = prometheus.NewDesc("stratum_agent_certificate_renew_after_timestamp_seconds", "When the listener suggested renewing (Unix time).", nil, nil)
	descLastRenewal = prometheus.NewDesc("stratum_agent_last_renewal_timestamp_seconds", "When the certificate was last renewed (Unix time; absent before the first renewal).", nil, nil)
	descFailing     = prometheus.NewDesc("stratum_agent_renewal_failing", "1 when the last renewal attempt failed (its error is in `stratum-agent status`).", nil, nil)
)

// stateCollector reads the identity at each scrape.
type stateCollector struct{ st State }

func (c stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descJoined, descExpiry, descRenewAfter, descLastRenewal, descFailing} {
		ch <- d
	}
}

func (c stateCollector) Collect(ch chan<- prometheus.Metric) {
	id, ok, err := c.st.Identity()
	if err != nil || !ok {
		ch <- prometheus.MustNewConstMetric(descJoined, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(descJoined, prometheus.GaugeValue, 1)
	ch <- prometheus.MustNewConstMetric(descExpiry, prometheus.GaugeValue, float64(id.NotAfter.Unix()))
	ch <- prometheus.MustNewConstMetric(descRenewAfter, prometheus.GaugeValue, float64(id.RenewAfter.Unix()))
	if id.LastRenewal != nil {
		ch <- prometheus.MustNewConstMetric(descLastRenewal, prometheus.GaugeValue, float64(id.LastRenewal.Unix()))
	}
	failing := 0.0
	if id.LastError != "" {
		failing = 1
	}
	ch <- prometheus.MustNewConstMetric(descFailing, prometheus.GaugeValue, failing)
}
