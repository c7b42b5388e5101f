package etcdtest

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/stratumjoin/stratum/internal/testbin"
	"github.com/stratumjoin/stratum/internal/testenv"
)

// ProcOption changes how StartProcs runs its members.
type ProcOption func(*procConfig)

type procConfig struct {
	tls            bool
	clientCertAuth bool
	user, password string
	durable        bool
}

// WithTLS serves the client URLs over TLS with a certificate from a CA the
// test makes (Procs.CAFile). Peer traffic stays plain: it never leaves the
// test's loopback proxies.
func WithTLS() ProcOption { return func(c *procConfig) { c.tls = true } }

// WithClientCertAuth makes etcd require a client certificate signed by the
// test CA (Procs.ClientCertFile, Procs.ClientKeyFile). It implies WithTLS.
func WithClientCertAuth() ProcOption {
	return func(c *procConfig) { c.tls, c.clientCertAuth = true, true }
}

// WithAuth turns on etcd's authentication with user root and the given
// password once the cluster is up.
func WithAuth(password string) ProcOption {
	return func(c *procConfig) { c.user, c.password = "root", password }
}

// WithFsync keeps etcd's fsync on, for benchmarks and durability tests.
func WithFsync() ProcOption { return func(c *procConfig) { c.durable = true } }

// Procs is a cluster of etcd members running as processes on loopback.
type Procs struct {
	Dir     string
	Members []*Member

	// Set with WithTLS: the CA that signed the server certificates, and
	// a client certificate the same CA signed (CN "root").
	CAFile, ClientCertFile, ClientKeyFile string
	// Set with WithAuth.
	User, Password string

	bin string
	cfg procConfig
	t   testing.TB
}

// Member is one etcd process. Its peer URL goes through a proxy the test
// controls, so its peer traffic can be cut without touching the process.
type Member struct {
	Name      string
	ClientURL string
	DataDir   string

	id string // etcd's member id, as peers send it in X-Server-From

	procs      *Procs
	peerListen string // where etcd listens for peers
	args       []string
	log        string
	proxy      *peerProxy

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed once cmd has exited
}

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// etcdBinary builds etcd from its Go module once per test process. The
// binary is renamed into place, so a process of another test binary that
// still runs the previous one is undisturbed.
func etcdBinary() (string, error) {
	binOnce.Do(func() {
		dir := filepath.Join(os.TempDir(), fmt.Sprintf("stratum-etcdtest-%d", os.Getuid()))
		if binErr = os.MkdirAll(dir, 0o755); binErr != nil {
			return
		}
		tmp, err := os.MkdirTemp(dir, "build")
		if err != nil {
			binErr = err
			return
		}
		defer os.RemoveAll(tmp)
		if binErr = testbin.Build(tmp, nil, "./internal/store/etcdtest/etcdmain"); binErr != nil {
			return
		}
		binPath = filepath.Join(dir, "etcd")
		binErr = os.Rename(filepath.Join(tmp, "etcdmain"), binPath)
	})
	return binPath, binErr
}

// StartProcs builds etcd and runs n members of one cluster as processes,
// each with its data in t.TempDir(). It returns once every member answers.
// Everything it starts is stopped by t.Cleanup.
func StartProcs(t testing.TB, n int, opts ...ProcOption) *Procs {
	t.Helper()
	var cfg procConfig
	for _, o := range opts {
		o(&cfg)
	}
	bin, err := etcdBinary()
	if err != nil {
		t.Fatalf("build etcd: %v", err)
	}
	p := &Procs{Dir: t.TempDir(), bin: bin, cfg: cfg, t: t}
	if cfg.tls {
		p.makeCerts(t)
	}
	scheme := "http"
	if cfg.tls {
		scheme = "https"
	}
	var initial []string
	for i := range n {
		m := &Member{
			Name:       fmt.Sprintf("m%d", i+1),
			ClientURL:  scheme + "://" + testenv.FreeTCP(t),
			peerListen: testenv.FreeTCP(t),
			procs:      p,
		}
		m.DataDir = filepath.Join(p.Dir, m.Name)
		m.log = filepath.Join(p.Dir, m.Name+".log")
		m.proxy = startPeerProxy(t, m.peerListen)
		initial = append(initial, m.Name+"=http://"+m.proxy.addr)
		p.Members = append(p.Members, m)
	}
	for _, m := range p.Members {
		m.args = []string{
			"--name", m.Name,
			"--data-dir", m.DataDir,
			"--listen-client-urls", m.ClientURL,
			"--advertise-client-urls", m.ClientURL,
			"--listen-peer-urls", "http://" + m.peerListen,
			"--initial-advertise-peer-urls", "http://" + m.proxy.addr,
			"--initial-cluster", strings.Join(initial, ","),
			"--initial-cluster-state", "new",
			"--initial-cluster-token", "stratum-test",
			"--heartbeat-interval", "50",
			"--election-timeout", "500",
			"--log-level", "warn",
		}
		if !cfg.durable {
			m.args = append(m.args, "--unsafe-no-fsync")
		}
		if cfg.tls {
			m.args = append(m.args,
				"--cert-file", filepath.Join(p.Dir, "server.crt"),
				"--key-file", filepath.Join(p.Dir, "server.key"))
		}
		if cfg.clientCertAuth {
			m.args = append(m.args, "--client-cert-auth", "--trusted-ca-file", p.CAFile)
		}
		if err := m.Start(); err != nil {
			t.Fatalf("start etcd %s: %v", m.Name, err)
		}
		t.Cleanup(func() { m.Kill() })
	}
	for _, m := range p.Members {
		p.WaitHealthy(t, m, 60*time.Second)
	}
	p.learnIDs(t)
	if cfg.password != "" {
		p.enableAuth(t)
	}
	return p
}

// Endpoints lists every member's client URL.
func (p *Procs) Endpoints() []string {
	var eps []string
	for _, m := range p.Members {
		eps = append(eps, m.ClientURL)
	}
	return eps
}

// ClientConfig returns a client configuration that reaches the given
// members (all of them when none are named), with the cluster's TLS and
// credentials.
func (p *Procs) ClientConfig(t testing.TB, members ...*Member) clientv3.Config {
	t.Helper()
	if len(members) == 0 {
		members = p.Members
	}
	var eps []string
	for _, m := range members {
		eps = append(eps, m.ClientURL)
	}
	cfg := clientv3.Config{
		Endpoints:   eps,
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
		Username:    p.User,
		Password:    p.Password,
	}
	if p.cfg.tls {
		pool := x509.NewCertPool()
		caPEM, err := os.ReadFile(p.CAFile)
		if err != nil {
			t.Fatal(err)
		}
		pool.AppendCertsFromPEM(caPEM)
		tc := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
		if p.cfg.clientCertAuth {
			pair, err := tls.LoadX509KeyPair(p.ClientCertFile, p.ClientKeyFile)
			if err != nil {
				t.Fatal(err)
			}
			tc.Certificates = []tls.Certificate{pair}
		}
		cfg.TLS = tc
	}
	return cfg
}

// Client connects to the given members (all when none are named); it is
// closed by t.Cleanup.
func (p *Procs) Client(t testing.TB, members ...*Member) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(p.ClientConfig(t, members...))
	if err != nil {
		t.Fatalf("etcd client: %v", err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// WaitHealthy waits until m serves a linearizable read.
func (p *Procs) WaitHealthy(t testing.TB, m *Member, limit time.Duration) {
	t.Helper()
	cli, err := clientv3.New(p.ClientConfig(t, m))
	if err != nil {
		t.Fatalf("etcd client for %s: %v", m.Name, err)
	}
	defer cli.Close()
	deadline := time.Now().Add(limit)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := cli.Get(ctx, "health")
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("etcd %s not healthy after %v: %v\n%s", m.Name, limit, err, m.LogTail())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// learnIDs asks the cluster for its members' ids, which the peer proxies
// need to tell who is calling.
func (p *Procs) learnIDs(t testing.TB) {
	t.Helper()
	cli := p.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := cli.MemberList(ctx)
	if err != nil {
		t.Fatalf("etcd member list: %v", err)
	}
	for _, pm := range resp.Members {
		for _, m := range p.Members {
			if m.Name == pm.Name {
				m.id = fmt.Sprintf("%x", pm.ID)
			}
		}
	}
	for _, m := range p.Members {
		if m.id == "" {
			t.Fatalf("etcd did not list member %s", m.Name)
		}
	}
}

func (p *Procs) enableAuth(t testing.TB) {
	t.Helper()
	cli := p.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cli.UserAdd(ctx, p.cfg.user, p.cfg.password); err != nil {
		t.Fatalf("etcd user add: %v", err)
	}
	if _, err := cli.UserGrantRole(ctx, p.cfg.user, "root"); err != nil {
		t.Fatalf("etcd grant root: %v", err)
	}
	if _, err := cli.AuthEnable(ctx); err != nil {
		t.Fatalf("etcd auth enable: %v", err)
	}
	p.User, p.Password = p.cfg.user, p.cfg.password
}

// Start runs the member's process (again, after Kill or Stop: its data
// directory makes it rejoin the cluster it was part of).
func (m *Member) Start() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd != nil {
		return errors.New("already running")
	}
	logf, err := os.OpenFile(m.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command(m.procs.bin, m.args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); logf.Close(); close(done) }()
	m.cmd, m.done = cmd, done
	return nil
}

// Kill ends the member with SIGKILL, as a crash would.
func (m *Member) Kill() { m.signal(syscall.SIGKILL) }

// Stop ends the member with SIGTERM.
func (m *Member) Stop() { m.signal(syscall.SIGTERM) }

func (m *Member) signal(sig syscall.Signal) {
	m.mu.Lock()
	cmd, done := m.cmd, m.done
	m.cmd = nil
	m.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(sig)
	<-done
}

// Partition cuts the member off from its peers in both directions: the
// others cannot reach it and it cannot reach them. Its clients still reach
// it, and get no answer that needs the cluster. Heal restores it.
func (m *Member) Partition() { m.partition(true) }

// Heal lets the member's peer traffic through again.
func (m *Member) Heal() { m.partition(false) }

func (m *Member) partition(cut bool) {
	m.proxy.setDown(cut)
	for _, o := range m.procs.Members {
		if o != m {
			o.proxy.block(m.id, cut)
		}
	}
}

// LogTail returns the end of the member's log, for failure messages.
func (m *Member) LogTail() string {
	b, _ := os.ReadFile(m.log)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// peerProxy forwards an etcd member's peer traffic to its peer listener.
// etcd's peers speak HTTP/1.1 and name themselves in X-Server-From, so the
// proxy can cut the traffic of one member in both directions: its own
// proxy refuses everyone (the others cannot reach it), and every other
// proxy refuses connections from it (it cannot reach them, neither by a
// stream nor by its pipeline).
type peerProxy struct {
	addr   string
	target string

	mu      sync.Mutex
	down    bool            // refuse every connection
	blocked map[string]bool // refuse connections from these member ids
	conns   map[net.Conn]string
}

func startPeerProxy(t testing.TB, target string) *peerProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &peerProxy{addr: ln.Addr().String(), target: target, blocked: map[string]bool{}, conns: map[net.Conn]string{}}
	t.Cleanup(func() { ln.Close(); p.setDown(true) })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(c)
		}
	}()
	return p
}

func (p *peerProxy) serve(c net.Conn) {
	defer c.Close()
	// read the first request's head to learn who is calling
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(c)
	var head []byte
	from := ""
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return
		}
		head = append(head, line...)
		if k, v, ok := strings.Cut(strings.TrimSpace(string(line)), ":"); ok && strings.EqualFold(k, "X-Server-From") {
			from = strings.TrimSpace(v)
		}
		if len(line) <= 2 {
			break
		}
	}
	_ = c.SetReadDeadline(time.Time{})
	if !p.track(c, from) {
		return
	}
	up, err := net.DialTimeout("tcp", p.target, time.Second)
	if err != nil {
		p.untrack(c)
		return
	}
	defer up.Close()
	if !p.track(up, from) {
		p.untrack(c)
		return
	}
	done := make(chan struct{}, 2)
	go func() {
		if _, err := up.Write(head); err == nil {
			_, _ = io.Copy(up, br)
		}
		done <- struct{}{}
	}()
	go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
	<-done
	p.untrack(c, up)
}

func (p *peerProxy) track(c net.Conn, from string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.down || p.blocked[from] {
		return false
	}
	p.conns[c] = from
	return true
}

func (p *peerProxy) untrack(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		delete(p.conns, c)
	}
}

// setDown refuses (or again allows) every connection.
func (p *peerProxy) setDown(down bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = down
	p.closeMatching(func(string) bool { return down })
}

// block refuses (or again allows) connections from one member.
func (p *peerProxy) block(from string, blocked bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if blocked {
		p.blocked[from] = true
	} else {
		delete(p.blocked, from)
	}
	p.closeMatching(func(f string) bool { return blocked && f == from })
}

func (p *peerProxy) closeMatching(match func(from string) bool) {
	for c, from := range p.conns {
		if match(from) {
			c.Close()
			delete(p.conns, c)
		}
	}
}

// makeCerts writes a test CA, a server certificate for 127.0.0.1 and a
// client certificate with CN "root" into p.Dir.
func (p *Procs) makeCerts(t testing.TB) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "etcd test CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	p.CAFile = filepath.Join(p.Dir, "ca.crt")
	writePEM(t, p.CAFile, "CERTIFICATE", caDER)
	issue := func(name string, serial int64, tmpl *x509.Certificate) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl.SerialNumber = big.NewInt(serial)
		tmpl.NotBefore, tmpl.NotAfter = now.Add(-time.Hour), now.Add(24*time.Hour)
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		keyDER, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		writePEM(t, filepath.Join(p.Dir, name+".crt"), "CERTIFICATE", der)
		writePEM(t, filepath.Join(p.Dir, name+".key"), "PRIVATE KEY", keyDER)
	}
	issue("server", 2, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "etcd"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:    []string{"localhost"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	})
	issue("client", 3, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "root"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	p.ClientCertFile = filepath.Join(p.Dir, "client.crt")
	p.ClientKeyFile = filepath.Join(p.Dir, "client.key")
}

func writePEM(t testing.TB, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}
