package etcdstore

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stratumjoin/stratum/internal/store"
)

// Query options of an etcd store URL (see the package comment).
const (
	OptCACert       = "cacert"
	OptCert         = "cert"
	OptKey          = "key"
	OptUser         = "user"
	OptPasswordFile = "password-file"
)

// applyQuery applies the URL's TLS and authentication options to cfg.
func applyQuery(cfg *clientv3.Config, u *url.URL) error {
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return fmt.Errorf("etcd store url: query: %w", err)
	}
	for k, v := range q {
		switch k {
		case OptCACert, OptCert, OptKey, OptUser, OptPasswordFile:
			if len(v) != 1 || v[0] == "" {
				return fmt.Errorf("etcd store url: give %s once, not empty", k)
			}
		default:
			return fmt.Errorf("etcd store url: unknown option %q (have cacert, cert, key, user, password-file)", k)
		}
	}
	ca, cert, key := q.Get(OptCACert), q.Get(OptCert), q.Get(OptKey)
	if (ca != "" || cert != "") && cfg.TLS == nil {
		return errors.New("etcd store url: cacert and cert need TLS: use etcds://")
	}
	if (cert == "") != (key == "") {
		return errors.New("etcd store url: cert and key go together")
	}
	if ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return fmt.Errorf("etcd ca certificate: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("etcd ca certificate %s holds no PEM certificate", ca)
		}
		cfg.TLS.RootCAs = pool
	}
	if cert != "" {
		if err := checkPrivate(key); err != nil {
			return err
		}
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return fmt.Errorf("etcd client certificate: %w", err)
		}
		cfg.TLS.Certificates = []tls.Certificate{pair}
	}
	user, pwFile := q.Get(OptUser), q.Get(OptPasswordFile)
	if (user == "") != (pwFile == "") {
		return errors.New("etcd store url: user and password-file go together")
	}
	if pwFile != "" {
		if err := checkPrivate(pwFile); err != nil {
			return err
		}
		b, err := os.ReadFile(pwFile)
		if err != nil {
			return fmt.Errorf("etcd password: %w", err)
		}
		cfg.Username, cfg.Password = user, strings.TrimRight(string(b), "\r\n")
		if cfg.Password == "" {
			return fmt.Errorf("etcd password file %s is empty", pwFile)
		}
	}
	return nil
}

// checkPrivate refuses a secret file that group or others can read.
func checkPrivate(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("etcd credentials: %w", err)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return fmt.Errorf("%s has mode %#o; a key or password file must be 0600 or 0400", path, perm)
	}
	return nil
}

// explain turns a failure to reach or use etcd into an error that says
// why: a refusal (credentials, certificates) wraps store.ErrRefused; a
// cluster that does not answer stays a plain, retryable error.
func explain(ctx context.Context, cfg clientv3.Config, err error) error {
	eps := strings.Join(cfg.Endpoints, ",")
	switch {
	case errors.Is(err, rpctypes.ErrAuthFailed):
		return fmt.Errorf("%w: etcd at %s rejected user %q or its password (--etcd-user, --etcd-password-file)", store.ErrRefused, eps, cfg.Username)
	case errors.Is(err, rpctypes.ErrUserEmpty), errors.Is(err, rpctypes.ErrInvalidAuthToken):
		return fmt.Errorf("%w: etcd at %s has authentication on and wants a user: give --etcd-user and --etcd-password-file", store.ErrRefused, eps)
	case errors.Is(err, rpctypes.ErrPermissionDenied):
		return fmt.Errorf("%w: etcd user %q may not read and write the store's prefix (grant it a role on the prefix)", store.ErrRefused, cfg.Username)
	}
	if cfg.TLS != nil {
		if why := probeTLS(ctx, cfg); why != "" {
			return fmt.Errorf("%w: %s", store.ErrRefused, why)
		}
	}
	return fmt.Errorf("reach etcd at %s: %w", eps, err)
}

// probeTLS makes one TLS handshake with each endpoint, as the etcd client
// would, to learn what the client's error hides: which side refused the
// other's certificate. It returns "" when a handshake succeeds or no
// endpoint answers.
func probeTLS(ctx context.Context, cfg clientv3.Config) string {
	for _, ep := range cfg.Endpoints {
		host := strings.TrimPrefix(ep, "https://")
		conf := cfg.TLS.Clone()
		conf.NextProtos = []string{"h2"}
		if h, _, err := net.SplitHostPort(host); err == nil && conf.ServerName == "" {
			conf.ServerName = h
		}
		d := tls.Dialer{NetDialer: &net.Dialer{Timeout: 2 * time.Second}, Config: conf}
		pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		c, err := d.DialContext(pctx, "tcp", host)
		cancel()
		if err == nil {
			// In TLS 1.3 the server judges our certificate after the
			// handshake: its alert arrives on the first read.
			tc := c.(*tls.Conn)
			_ = tc.SetReadDeadline(time.Now().Add(time.Second))
			_, err = tc.Read(make([]byte, 1))
			tc.Close()
			var ne net.Error
			if err == nil || errors.As(err, &ne) && ne.Timeout() {
				continue
			}
		}
		if why := tlsReason(host, cfg, err); why != "" {
			return why
		}
	}
	return ""
}

func tlsReason(host string, cfg clientv3.Config, err error) string {
	var unknown x509.UnknownAuthorityError
	var hostErr x509.HostnameError
	var alert tls.AlertError
	var rec tls.RecordHeaderError
	var verify *tls.CertificateVerificationError
	msg := err.Error()
	switch {
	case errors.As(err, &unknown) || errors.As(err, &verify) && errors.As(verify.Err, &unknown):
		return fmt.Sprintf("etcd at %s presents a certificate signed by a CA we do not trust: give the CA that signs etcd's server certificates with --etcd-cacert", host)
	case errors.As(err, &hostErr):
		return fmt.Sprintf("etcd at %s presents a certificate for another host: %v", host, hostErr)
	case errors.As(err, &rec):
		return fmt.Sprintf("etcd at %s does not speak TLS: use etcd:// instead of etcds://", host)
	case errors.As(err, &alert) || strings.Contains(msg, "remote error: tls:"):
		if len(cfg.TLS.Certificates) == 0 {
			return fmt.Sprintf("etcd at %s requires a client certificate (%s): give --etcd-cert and --etcd-key", host, msg)
		}
		return fmt.Sprintf("etcd at %s refused our client certificate (%s): --etcd-cert is not signed by a CA etcd trusts (its --trusted-ca-file)", host, msg)
	}
	return ""
}
