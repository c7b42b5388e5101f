package listener

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/stratumjoin/stratum/listener/adminapi"
	"github.com/stratumjoin/stratum/listener/registry"
)

var defaultRegistry = sync.OnceValue(registry.Default)

// Registry is the inventory the admin API mints against: Config.Registry,
// or the default one (tenant, platform site and pool, all "default").
func (l *Listener) Registry() *registry.Registry {
	if l.cfg.Registry != nil {
		return l.cfg.Registry
	}
	return defaultRegistry()
}

// adminAPI is the one admin API both the unix socket and the HTTPS
// listener serve, so they share its per-organization rate limits.
func (l *Listener) adminAPI() *adminapi.Server {
	l.apiOnce.Do(func() { l.api = adminapi.New(l, l.logger) })
	return l.api
}

// HTTPSAddr is the address of the admin API's HTTPS listener once Run
// listens (nil without one).
func (l *Listener) HTTPSAddr() net.Addr {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.httpsAddr
}

type httpsServer struct {
	srv *http.Server
	ln  net.Listener
}

func (h *httpsServer) run() error {
	if err := h.srv.ServeTLS(h.ln, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("admin https: %w", err)
	}
	return nil
}

func (h *httpsServer) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return h.srv.Shutdown(ctx)
}

// serveHTTPS listens for the admin API over TLS 1.3 with the listener's
// own certificate (the one QUIC presents, chained to the cluster CA).
// Callers authenticate with a bearer API key; nobody is the bootstrap
// admin here.
func (l *Listener) serveHTTPS(ctx context.Context) (*httpsServer, error) {
	ln := l.cfg.HTTPSListener
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", l.cfg.HTTPSListen); err != nil {
			return nil, fmt.Errorf("admin https: %w", err)
		}
	}
	l.mu.Lock()
	l.httpsAddr = ln.Addr()
	l.mu.Unlock()
	getCert := func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
		l.mu.RLock()
		defer l.mu.RUnlock()
		c := l.tlsCert
		return &c, nil
	}
	if len(l.cfg.HTTPSNames) > 0 {
		cert, err := l.httpsCert()
		if err != nil {
			ln.Close()
			return nil, err
		}
		getCert = func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return cert, nil }
	}
	l.logger.Info("admin api https listening", "addr", ln.Addr().String(), "extraNames", l.cfg.HTTPSNames)
	srv := &http.Server{
		Handler:           l.adminAPI(),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(l.logger.Handler(), slog.LevelWarn),
		BaseContext:       func(net.Listener) context.Context { return ctx },
		TLSConfig: &tls.Config{
			MinVersion:     tls.VersionTLS13,
			GetCertificate: getCert,
		},
	}
	return &httpsServer{srv: srv, ln: ln}, nil
}

// httpsCert issues, in memory and at start, a certificate for the HTTPS
// admin API with the listener certificate's names plus --https-name.
func (l *Listener) httpsCert() (*tls.Certificate, error) {
	l.mu.RLock()
	ca, base := l.ca, l.tlsCert.Leaf
	l.mu.RUnlock()
	if base == nil {
		return nil, errors.New("admin https: the listener certificate is not loaded")
	}
	dns, ips := append([]string(nil), base.DNSNames...), append([]net.IP(nil), base.IPAddresses...)
	for _, n := range l.cfg.HTTPSNames {
		if ip := net.ParseIP(n); ip != nil {
			ips = append(ips, ip)
		} else {
			dns = append(dns, n)
		}
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("admin https: %w", err)
	}
	der, err := ca.IssueListener(key.Public(), l.settings.TrustDomain, dns, ips, l.now())
	if err != nil {
		return nil, fmt.Errorf("admin https: --https-name: %w", err)
	}
	chain := [][]byte{der}
	for _, c := range ca.Intermediates() {
		chain = append(chain, c.Raw)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("admin https: %w", err)
	}
	return &tls.Certificate{Certificate: chain, PrivateKey: key, Leaf: leaf}, nil
}
