package adminapi_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stratumjoin/stratum/agent"
	"github.com/stratumjoin/stratum/internal/cluster"
	"github.com/stratumjoin/stratum/internal/joincode"
	"github.com/stratumjoin/stratum/internal/wire"
	"github.com/stratumjoin/stratum/listener"
	"github.com/stratumjoin/stratum/listener/adminapi"
	"github.com/stratumjoin/stratum/listener/listenertest"
	"github.com/stratumjoin/stratum/listener/registry"
)

// syncBuffer collects the listener's log lines from many goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// clock is the listener's clock: real time plus an offset a test can
// advance to expire things without waiting.
type clock struct {
	mu     sync.Mutex
	offset time.Duration
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.offset)
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.offset += d
}

// env is a running listener with the test registry, its admin socket and
// its HTTPS admin API.
type env struct {
	t     testing.TB
	l     *listenertest.Listener
	logs  *syncBuffer
	clock *clock
	sock  *http.Client
	https *http.Client
	base  string // https://127.0.0.1:port
}

func loadTestRegistry(t testing.TB) *registry.Registry {
	t.Helper()
	reg, err := registry.Load(filepath.Join("testdata", "registry.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

func newEnv(t testing.TB, opts ...func(*listener.Config)) *env {
	t.Helper()
	logs := &syncBuffer{}
	clk := &clock{}
	cfg := listener.Config{
		Now:         clk.now,
		Registry:    loadTestRegistry(t),
		HTTPSListen: "127.0.0.1:0",
		Logger:      slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	for _, o := range opts {
		o(&cfg)
	}
	l := listenertest.Start(t, listenertest.Options{Config: cfg})
	pool := x509.NewCertPool()
	for _, r := range l.Roots() {
		pool.AddCert(r)
	}
	sockTr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", l.AdminSocket)
	}}
	httpsTr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13}, ForceAttemptHTTP2: true}
	e := &env{
		t: t, l: l, logs: logs, clock: clk,
		sock:  &http.Client{Transport: sockTr, Timeout: time.Minute},
		https: &http.Client{Transport: httpsTr, Timeout: time.Minute},
		base:  "https://" + l.HTTPSAddr().String(),
	}
	t.Cleanup(func() { sockTr.CloseIdleConnections(); httpsTr.CloseIdleConnections() })
	return e
}

// caller says how a request authenticates: as the bootstrap admin over
// the unix socket, or over HTTPS with a bearer (none when empty).
type caller struct {
	socket bool
	bearer string
}

var admin = caller{socket: true}

func bearer(key string) caller { return caller{bearer: key} }

var anonymous = caller{}

type response struct {
	status int
	header http.Header
	body   []byte
}

// json decodes the body into a generic value.
func (r response) json(t testing.TB) map[string]any {
	t.Helper()
	var v map[string]any
	if err := json.Unmarshal(r.body, &v); err != nil {
		t.Fatalf("answer is not a JSON object (%d): %v\n%s", r.status, err, r.body)
	}
	return v
}

func (r response) decode(t testing.TB, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("decode answer (%d): %v\n%s", r.status, err, r.body)
	}
}

// do sends body (a string is sent as is, anything else as JSON).
func (e *env) do(c caller, method, path string, body any, headers ...string) response {
	e.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		raw, err := json.Marshal(b)
		if err != nil {
			e.t.Fatal(err)
		}
		rd = bytes.NewReader(raw)
	}
	client, base := e.https, e.base
	if c.socket {
		client, base = e.sock, "http://stratum-admin"
	}
	req, err := http.NewRequest(method, base+path, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.bearer != "" {
		req.Header.Set("Authorization", "Bearer "+c.bearer)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: b}
}

// apiKey creates an API key through the admin socket and returns its bearer.
func (e *env) apiKey(tenant string, grants []string, scopes ...string) string {
	e.t.Helper()
	req := adminapi.APIKeyRequest{Tenant: tenant, Scopes: scopes}
	for _, g := range grants {
		a, r, _ := strings.Cut(g, "@")
		req.Grants = append(req.Grants, cluster.Grant{Action: a, Resource: r})
	}
	k, err := e.l.Admin.CreateAPIKey(context.Background(), req)
	if err != nil {
		e.t.Fatal(err)
	}
	return k.Key
}

// apiKeyID is the id inside a bearer sjk_<id>_<secret>.
func apiKeyID(bearer string) string { return strings.Split(bearer, "_")[1] }

// events returns every event of type typ.
func (e *env) events(typ string) []cluster.Event {
	e.t.Helper()
	evs, err := e.l.Cluster().Events(context.Background(), "", 0)
	if err != nil {
		e.t.Fatal(err)
	}
	var out []cluster.Event
	for _, ev := range evs {
		if ev.Type == typ {
			out = append(out, ev)
		}
	}
	return out
}

// machine is a fake machine's claimed facts; each has its own identity.
func machine(uuid, hostname string) wire.Facts {
	return wire.Facts{ProductUUID: uuid, Hostname: hostname, MACs: []string{"02:00:00:00:00:01"}}
}

// join runs a real agent join over QUIC with secret, in its own state
// directory.
func (e *env) join(secret string, facts wire.Facts) (*agent.Joined, error) {
	e.t.Helper()
	sec, err := joincode.Parse(secret)
	if err != nil {
		e.t.Fatalf("the minted secret does not parse: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return agent.Join(ctx, agent.JoinConfig{StateDir: e.t.TempDir(), Endpoint: e.l.Endpoint, Secret: sec, Facts: facts})
}

// mustJoin joins and fails the test unless it succeeds.
func (e *env) mustJoin(secret string, facts wire.Facts) *agent.Joined {
	e.t.Helper()
	j, err := e.join(secret, facts)
	if err != nil {
		e.t.Fatalf("join: %v", err)
	}
	return j
}

func apiKeyRequest(tenant string, scopes []string, ttl time.Duration) adminapi.APIKeyRequest {
	return adminapi.APIKeyRequest{Tenant: tenant, Scopes: scopes, TTLSeconds: int(ttl / time.Second)}
}
