package listener

import (
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"
	"golang.org/x/sync/errgroup"

	"github.com/stratumjoin/stratum/internal/cluster"
	"github.com/stratumjoin/stratum/internal/gcfloor"
	"github.com/stratumjoin/stratum/internal/keyseal"
	"github.com/stratumjoin/stratum/internal/pake"
	"github.com/stratumjoin/stratum/internal/store"
	"github.com/stratumjoin/stratum/internal/store/boltstore"
	"github.com/stratumjoin/stratum/internal/tpm"
	"github.com/stratumjoin/stratum/internal/wire"
	"github.com/stratumjoin/stratum/listener/adminapi"
	"github.com/stratumjoin/stratum/listener/registry"
	"github.com/stratumjoin/stratum/pki"
	"github.com/stratumjoin/stratum/pki/authority"
)

// Config is what `stratum-listener serve` wires.
type Config struct {
	DataDir string
	// Listen is the UDP address for QUIC; ignored when PacketConn is set.
	Listen string
	// PacketConn is a socket handed in by systemd socket activation.
	PacketConn net.PacketConn
	// AdminSocket is the unix socket path of the admin API ("" = none).
	AdminSocket string
	// AdminListener is an admin socket handed in by socket activation.
	AdminListener net.Listener
	// StoreURL names the store; default bolt:<DataDir>/state.db.
	StoreURL string
	// Store, when set, is used instead of opening StoreURL.
	Store  store.Store
	Logger *slog.Logger
	Now    func() time.Time
	// RetryAbove is the per-source rate of new connections (per second)
	// above which the listener makes a source prove its address with a
	// QUIC Retry. 0 means 20.
	RetryAbove float64
	// MaxConnections bounds the connections served at once (default
	// 2048); past it new ones are refused and agents back off and retry,
	// so the listener's memory stays bounded under a herd.
	MaxConnections int
	// MaxHandshakes bounds the handshakes in progress at once (default 256
	// per CPU; negative: no bound). Past it the Initial packets of new
	// connections are dropped unanswered and their agents' QUIC stacks
	// send them again until a slot frees (on a PacketConn that is not a
	// *net.UDPConn they are refused at the first packet instead), so a
	// herd is served at the rate the CPUs allow instead of every
	// handshake slowing past its timeout.
	MaxHandshakes int
	// MaxActive bounds the connections at work at once: handshakes, and
	// joins and renewals past them, but not the joins waiting for an
	// approval, nor connections waiting on their peer for longer than
	// PeerGrace (default 128 per CPU; negative: no bound). Past it, or
	// past MaxHandshakes, new connections wait in a backlog of Backlog
	// connections (default 16,384), first come first served, for up to
	// BacklogWait (default 25s, within the agent's 30 s dial timeout); a
	// full backlog drops their Initials, which their agents send again.
	// Both need the socket to be a *net.UDPConn.
	MaxActive   int
	Backlog     int
	BacklogWait time.Duration
	// PeerGrace is how long a connection may wait on its peer (a handshake
	// flight, its stream, a frame, its close) and keep its place among the
	// connections at work (default 1s; negative: always keeps it).
	PeerGrace time.Duration
	// GCHeadroomMiB is how far the heap may grow between garbage
	// collections while the live heap is smaller than that (package
	// gcfloor: a few hundred joins between collections instead of ~20);
	// 0 leaves GOGC alone, as does an operator's GOGC or GOMEMLIMIT.
	GCHeadroomMiB int
	// MaxRenewals bounds the renewal connections (ALPN stratum-node/1)
	// served at once, apart from joins (default 512), so a join flood
	// never shuts renewals out.
	MaxRenewals int
	// PerSourceConnections is one source address's share of the
	// connections in flight (default 64; negative: no share).
	PerSourceConnections int
	// FirstStream is how long a connection may go without opening its
	// stream before it is closed (default 5s).
	FirstStream time.Duration
	// UnprovenPerSource and UnprovenPerPrefix are the budget of unproven
	// join starts per BudgetWindow of one address and of its /24 or /64
	// (defaults 8, 32 and 10m; UnprovenPerSource negative lifts the
	// budget, for tests and benchmarks that guess from one address).
	UnprovenPerSource int
	UnprovenPerPrefix int
	BudgetWindow      time.Duration
	// BudgetWait is how long a start over its source's budget waits for a
	// proven start of the same source to give its charge back before it
	// is told to come back later (default 10s), so machines behind one NAT
	// that join at once queue instead of failing.
	BudgetWait time.Duration
	// RenewGrace is how long after its expiry a node certificate still
	// renews (default 96h); later the node needs a new code.
	RenewGrace time.Duration
	// Ready is called once the store is open and the sockets listen.
	Ready func(addr net.Addr)
	// hooks observe the protocol in tests (export_test.go sets them).
	hooks hooks
	// Registry is the inventory of tenants, sites, pools, networks and
	// roles the admin API mints against; nil means registry.Default().
	Registry *registry.Registry
	// HTTPSListen is the TCP address of the admin API's HTTPS listener,
	// which takes bearer API keys ("" = none).
	HTTPSListen string
	// HTTPSListener, when set, is used instead of listening on HTTPSListen.
	HTTPSListener net.Listener
	// StoreTimeout bounds every store call of a join, a renewal and an
	// admin request (default 5 s): past it the agent reads
	// JOIN_UNAVAILABLE and the admin API answers 503, instead of waiting
	// on an etcd cluster that lost its quorum.
	StoreTimeout time.Duration
	// HTTPSNames are extra DNS names or IP addresses for the HTTPS admin
	// certificate (the join endpoints' names are always in it).
	HTTPSNames []string
	// MetricsListen is the TCP address of /metrics, /healthz and /readyz
	// ("" = none); MetricsListener, when set, is used instead.
	MetricsListen   string
	MetricsListener net.Listener
	// StoreHealth, when set, answers /readyz's store check instead of a
	// read of the store (a store that tracks its own health sets it).
	StoreHealth func(ctx context.Context) error
	// TPMRoots are the TPM manufacturer certificates EK certificates must
	// chain to (serve --tpm-ca-dir); without them an attested EK is an
	// identity to pin, not proof of a genuine TPM (docs/tpm.md).
	TPMRoots []*x509.Certificate
}

// DefaultStoreTimeout is Config.StoreTimeout's default.
const DefaultStoreTimeout = 5 * time.Second

// hooks are test observation points; all optional.
type hooks struct {
	// Challenge is called as each Challenge is sent: real says whether
	// it was computed from a stored record (not a fake one), counted
	// whether the attempt was counted.
	Challenge func(locator string, real, counted bool)
	// Proof is called when a Proof frame arrives, before KE3 is checked.
	Proof func(locator string)
	// Accept is called for each new connection: addrVerified is true when
	// the source proved its address with a Retry.
	Accept func(addrVerified bool)
	// Accepted is called as a connection whose handshake completed is
	// taken from quic-go, before it is served.
	Accepted func()
	// AcceptIdle, when set, replaces acceptIdle.
	AcceptIdle time.Duration
	// Dropped is called for each new connection's Initial the gate drops
	// (the backlog full).
	Dropped func()
}

// Listener serves joins, renewals and the admin API.
type Listener struct {
	cfg      Config
	settings Settings
	logger   *slog.Logger
	now      func() time.Time
	keys     authority.KeyDir
	opaque   *pake.ServerKeys
	// opaqueRaw is opaque.key as read at start, to tell whether the
	// cluster's copy in the store still matches it.
	opaqueRaw []byte
	// kek is set when the listener is one of a cluster whose keys are
	// sealed in the store; keysMu orders the changes of the key directory.
	kek      *keyseal.KEK
	keysMu   sync.Mutex
	cluster  *cluster.Cluster
	store    store.Store
	ownStore bool
	ksfMem   memReturner // see returnKSFMemory
	// burstMem returns the memory of a burst of connections (burst set)
	// once it has passed
	burstMem memReturner
	burst    atomic.Bool

	mu       sync.RWMutex
	ca       *authority.CA
	caFP     string
	tlsCert  tls.Certificate
	roots    []*x509.Certificate
	chainsFP map[string][][]byte // CA fingerprint -> caChain DER

	tpm        *tpm.Verifier
	limiters   sourceLimiters
	leaseQueue leaseQueue
	adm        admission
	pool       atomic.Pointer[acceptPool]
	active     atomic.Int64 // connections being served

	addr net.Addr

	metrics       *metrics
	metricsAddr   net.Addr
	proofFailures proofFailures

	apiOnce   sync.Once
	api       *adminapi.Server
	httpsAddr net.Addr
}

// New loads the data directory and opens the store.
func New(ctx context.Context, cfg Config) (*Listener, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	// zero picks the default (negative values, where allowed, turn a bound off)
	cfg.RetryAbove = cmp.Or(cfg.RetryAbove, 20)
	cfg.MaxConnections = cmp.Or(cfg.MaxConnections, 2048)
	if cfg.StoreTimeout <= 0 {
		cfg.StoreTimeout = DefaultStoreTimeout
	}
	cfg.MaxHandshakes = cmp.Or(cfg.MaxHandshakes, defaultMaxHandshakes())
	cfg.MaxActive = cmp.Or(cfg.MaxActive, defaultMaxActive())
	cfg.Backlog = cmp.Or(cfg.Backlog, defaultBacklog)
	cfg.BacklogWait = cmp.Or(cfg.BacklogWait, defaultBacklogWait)
	cfg.PeerGrace = cmp.Or(cfg.PeerGrace, defaultPeerGrace)
	cfg.MaxRenewals = cmp.Or(cfg.MaxRenewals, defaultMaxRenewals)
	cfg.PerSourceConnections = cmp.Or(cfg.PerSourceConnections, defaultPerSourceConnections)
	cfg.FirstStream = cmp.Or(cfg.FirstStream, defaultFirstStream)
	cfg.UnprovenPerSource = cmp.Or(cfg.UnprovenPerSource, cluster.DefaultBudget.PerAddress)
	cfg.UnprovenPerPrefix = cmp.Or(cfg.UnprovenPerPrefix, cluster.DefaultBudget.PerPrefix)
	cfg.BudgetWindow = cmp.Or(cfg.BudgetWindow, cluster.DefaultBudget.Window)
	cfg.BudgetWait = cmp.Or(cfg.BudgetWait, defaultBudgetWait)
	cfg.RenewGrace = cmp.Or(cfg.RenewGrace, defaultRenewGrace)
	dir, err := filepath.Abs(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	cfg.DataDir = dir
	settings, err := LoadSettings(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	l := &Listener{cfg: cfg, settings: settings, logger: cfg.Logger, now: cfg.Now, keys: authority.KeyDir{Path: filepath.Join(cfg.DataDir, "keys")}, tpm: tpm.NewVerifier(cfg.TPMRoots)}
	// a rate of packets is a matter of real time, not of the clock secrets expire by
	l.limiters.init(cfg.RetryAbove, time.Now)
	l.burstMem.before = l.burstReturned
	l.metrics = newMetrics(func() float64 { return float64(l.active.Load()) })
	l.metrics.watchAdmission(l.handshakesInProgress, l.addressChecksOn)
	l.store = cfg.Store
	if l.store == nil {
		url := cfg.StoreURL
		if url == "" {
			url = "bolt:" + filepath.Join(cfg.DataDir, "state.db")
		}
		if l.store, err = store.Open(ctx, url); err != nil {
			return nil, fmt.Errorf("open store: %w", err)
		}
		l.ownStore = true
	}
	l.store = store.WithDeadline(l.store, cfg.StoreTimeout)
	l.cluster = cluster.New(cluster.Config{Store: l.store, Logger: cfg.Logger, Now: cfg.Now})
	fail := func(err error) (*Listener, error) {
		if l.ownStore {
			l.store.Close()
		}
		return nil, err
	}
	if err := l.cluster.CheckSchema(ctx); err != nil {
		return fail(err)
	}
	// Before the keys are read: a listener that missed a rotation takes
	// the cluster's keys first.
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := l.checkSharedIdentity(cctx); err != nil {
		return fail(err)
	}
	raw, err := os.ReadFile(filepath.Join(l.keys.Path, opaqueKeyFile))
	if err != nil {
		return fail(fmt.Errorf("read opaque keys: %w", err))
	}
	l.opaqueRaw = raw
	if l.opaque, err = pake.DecodeServerKeys(raw); err != nil {
		return fail(err)
	}
	if err := l.loadCA(); err != nil {
		return fail(err)
	}
	return l, nil
}

// Store is the listener's store, for tests and the store commands; the
// admin facades reach it only through Cluster.
func (l *Listener) Store() store.Store { return l.store }

// Cluster gives access to the cluster state (admin facades, tests).
func (l *Listener) Cluster() *cluster.Cluster { return l.cluster }

// Settings returns the pinned settings.
func (l *Listener) Settings() Settings { return l.settings }

func (l *Listener) loadCA() error {
	ca, err := l.keys.LoadCA()
	if err != nil {
		return err
	}
	cert, _, err := l.keys.LoadOrCreateListenerCert(ca, l.settings.TrustDomain, l.now())
	if err != nil {
		return fmt.Errorf("listener certificate: %w", err)
	}
	roots, err := l.keys.Roots()
	if err != nil {
		return err
	}
	fp := ca.Fingerprint()
	chains := map[string][][]byte{pki.FormatFingerprint(fp): certsDER(ca.Chain())}
	// Retired roots still answer the PAKE of the secrets minted under
	// them, so their holders learn by name that they were revoked.
	retired, err := l.keys.RetiredRoots()
	if err != nil {
		return err
	}
	for _, r := range append(append([]*x509.Certificate(nil), roots...), retired...) {
		f := pki.FormatFingerprint(pki.FingerprintOf(r))
		if _, ok := chains[f]; !ok {
			chains[f] = [][]byte{r.Raw}
		}
	}
	l.mu.Lock()
	l.ca, l.caFP, l.tlsCert, l.roots, l.chainsFP = ca, pki.FormatFingerprint(fp), cert, roots, chains
	l.mu.Unlock()
	return nil
}

// CA returns the current CA and its fingerprint.
func (l *Listener) CA() (*authority.CA, string) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.ca, l.caFP
}

// Roots returns every root the cluster has used, newest first.
func (l *Listener) Roots() []*x509.Certificate {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.roots
}

// RotateCA makes a new root (cross-signed by the old one) and re-issues
// the listener certificate. The rules per kind (docs/secrets.md): join
// codes minted under an older root end at once, revoked by
// cluster.CARotatedBy with an event each (their holders are told
// JOIN_CODE_STALE); tokens and keys keep joining through the root they were
// minted under until RetireCA.
func (l *Listener) RotateCA(ctx context.Context, actor string) (string, error) {
	fp, err := l.rotateKeys(ctx, actor)
	if err != nil {
		return fp, err
	}
	_, err = l.cluster.RevokeUnderOtherRoots(ctx, fp, cluster.CARotatedBy, func(s *cluster.Secret) bool { return s.Kind == cluster.KindCode })
	return fp, err
}

// rotateKeys makes the new root, in the cluster's shared keys or in this
// listener's own key directory, with the ca.rotated event.
func (l *Listener) rotateKeys(ctx context.Context, actor string) (string, error) {
	if l.kek != nil {
		// The event is written with the sealed keys, in one transaction.
		return l.rotateShared(ctx, actor)
	}
	if _, _, err := l.keys.Rotate(l.settings.TrustDomain, l.now()); err != nil {
		return "", fmt.Errorf("rotate ca: %w", err)
	}
	if err := l.loadCA(); err != nil {
		return "", err
	}
	_, fp := l.CA()
	if err := l.cluster.Record(ctx, cluster.EventCARotated, actor, map[string]any{"caFingerprint": fp}); err != nil {
		return fp, fmt.Errorf("the CA was rotated to %s, but its event was not recorded: %w", fp, err)
	}
	return fp, nil
}

// RetireCA ends every root but the current one: nodes and listeners stop
// trusting them, and every secret minted under them is revoked by
// cluster.CARetiredBy, with an event each. It returns how many secrets it
// revoked.
func (l *Listener) RetireCA(ctx context.Context, actor string) (int, error) {
	var retired []*x509.Certificate
	fields := func(fp string) map[string]any {
		var fps []string
		for _, r := range retired {
			fps = append(fps, pki.FormatFingerprint(pki.FingerprintOf(r)))
		}
		return map[string]any{"caFingerprint": fp, "retired": strings.Join(fps, " ")}
	}
	if l.kek != nil {
		// the shared keys change under a compare-and-swap, with the event
		err := l.changeSharedKeys(ctx, actor, cluster.EventCARetired,
			func(pub sharedPublic) map[string]any { return fields(pub.CAFingerprint) },
			func() (err error) { retired, err = l.keys.Retire(); return err })
		if err != nil {
			return 0, fmt.Errorf("retire ca: %w", err)
		}
	} else {
		var err error
		if retired, err = l.keys.Retire(); err != nil {
			return 0, err
		}
		if err := l.loadCA(); err != nil {
			return 0, err
		}
		_, fp := l.CA()
		if err := l.cluster.Record(ctx, cluster.EventCARetired, actor, fields(fp)); err != nil {
			return 0, err
		}
	}
	_, fp := l.CA()
	return l.cluster.RevokeUnderOtherRoots(ctx, fp, cluster.CARetiredBy, nil)
}

// tlsConfig is the QUIC listener's TLS configuration. Renewals present
// the node certificate, verified by the renewal handler (which also
// accepts one that expired while the machine was off); a join presents
// none, so only a client that offers the renewal ALPN is asked for one:
// asking every join added a CertificateRequest and the agent's empty
// Certificate to each handshake, about 0.1 ms of the listener's CPU a join.
// An agent offers one ALPN, and a client that offers both is asked too.
func (l *Listener) tlsConfig() *tls.Config {
	join := l.tlsConfigAsking(tls.NoClientCert)
	renewal := l.tlsConfigAsking(tls.RequestClientCert)
	join.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
		if slices.Contains(hello.SupportedProtos, wire.ALPNNode) {
			return renewal, nil
		}
		return nil, nil // this one
	}
	return join
}

func (l *Listener) tlsConfigAsking(clientAuth tls.ClientAuthType) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		NextProtos: []string{wire.ALPNJoin, wire.ALPNNode},
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			l.mu.RLock()
			defer l.mu.RUnlock()
			c := l.tlsCert
			return &c, nil
		},
		ClientAuth: clientAuth,
		// No agent resumes a session: each join and renewal is a full
		// handshake its PAKE or node certificate authenticates, so a
		// ticket would be sealed for nothing (a renewal's would carry
		// the node's chain).
		SessionTicketsDisabled: true,
	}
}

// Run serves until ctx ends, or until one of its servers (QUIC, the admin
// socket, HTTPS) fails: the failure of one ends them all and is returned.
func (l *Listener) Run(ctx context.Context) error {
	defer func() {
		if l.ownStore {
			l.store.Close()
		}
	}()
	if l.cfg.GCHeadroomMiB > 0 {
		defer gcfloor.Start(uint64(l.cfg.GCHeadroomMiB) << 20).Stop()
	}
	resetRaw, err := l.derivedKey("quic stateless reset")
	if err != nil {
		return err
	}
	tokenRaw, err := l.derivedKey("quic token")
	if err != nil {
		return err
	}
	pc := l.cfg.PacketConn
	if pc == nil {
		addr := l.cfg.Listen
		if addr == "" {
			addr = ":" + DefaultPort
		}
		udp, err := net.ListenPacket("udp", addr)
		if err != nil {
			return fmt.Errorf("listen %s: %w", addr, err)
		}
		pc = udp
	}
	defer pc.Close()
	conn := pc
	if udp, ok := pc.(*net.UDPConn); ok && (l.cfg.MaxHandshakes > 0 || l.cfg.MaxActive > 0) {
		gated := newGatedConn(udp, l.passInitial)
		l.adm.mu.Lock()
		l.adm.backlog = backlog{max: max(l.cfg.Backlog, 0), perSource: l.cfg.PerSourceConnections, maxWait: l.cfg.BacklogWait}
		l.adm.letIn = gated.letIn
		l.adm.mu.Unlock()
		conn = gated
	}
	resetKey := quic.StatelessResetKey(resetRaw)
	tokenKey := quic.TokenGeneratorKey(tokenRaw)
	tr := &quic.Transport{
		Conn:                conn,
		StatelessResetKey:   &resetKey,
		TokenGeneratorKey:   &tokenKey,
		VerifySourceAddress: l.mustProveAddress,
		ConnContext: func(ctx context.Context, ci *quic.ClientInfo) (context.Context, error) {
			ctx, err := l.admit(ctx, ci)
			if err != nil {
				l.metrics.conns.WithLabelValues("refused").Inc()
				return nil, err
			}
			l.metrics.conns.WithLabelValues("accepted").Inc()
			return ctx, nil
		},
	}
	defer tr.Close()
	ln, err := tr.Listen(l.tlsConfig(), &quic.Config{
		HandshakeIdleTimeout:  5 * time.Second,
		MaxIdleTimeout:        30 * time.Second,
		MaxIncomingStreams:    4,
		MaxIncomingUniStreams: -1,
		// What a peer may send ahead of what the listener has read is
		// what the listener buffers for it: a frame is at most
		// wire.MaxFrame, so a stream needs no more than one frame of
		// window, and the connection no more than two. quic-go's
		// defaults (512 KiB growing to 6 MiB a stream and 15 MiB a
		// connection) would let each of thousands of connections that
		// wait on a busy code or an approval park megabytes here.
		InitialStreamReceiveWindow:     streamWindow,
		MaxStreamReceiveWindow:         streamWindow,
		InitialConnectionReceiveWindow: connWindow,
		MaxConnectionReceiveWindow:     connWindow,
		// No keepalive from the listener: a connection that does nothing
		// must not be held open by its peer's server. The agent keeps a
		// pending join alive itself.
		KeepAlivePeriod: 0,
		Allow0RTT:       false,
		// A join lives a few round trips: probing for a larger path MTU
		// costs padded packets the agent must acknowledge and never pays
		// back (TestListenerSendsNoPathMTUProbes).
		DisablePathMTUDiscovery: true,
	})
	if err != nil {
		return fmt.Errorf("quic listen: %w", err)
	}
	defer ln.Close()
	l.addr = pc.LocalAddr()

	g, gctx := errgroup.WithContext(ctx)
	pool := &acceptPool{ctx: gctx, ln: ln, idle: cmp.Or(l.cfg.hooks.AcceptIdle, acceptIdle)}
	l.pool.Store(pool)
	// after g.Wait, which ends gctx and so every accepter's wait
	defer pool.close()
	type server interface {
		run() error
		Close() error
	}
	var servers []server
	if l.cfg.AdminSocket != "" || l.cfg.AdminListener != nil {
		srv, err := l.serveAdmin(gctx)
		if err != nil {
			return err
		}
		servers = append(servers, srv)
	}
	if l.cfg.HTTPSListen != "" || l.cfg.HTTPSListener != nil {
		srv, err := l.serveHTTPS(gctx)
		if err != nil {
			for _, s := range servers {
				s.Close()
			}
			return err
		}
		servers = append(servers, srv)
	}
	for _, srv := range servers {
		g.Go(srv.run)
		g.Go(func() error {
			<-gctx.Done()
			if err := srv.Close(); err != nil {
				l.logger.Warn("close server", "err", err)
			}
			return nil
		})
	}
	if ml := l.cfg.MetricsListener; ml != nil || l.cfg.MetricsListen != "" {
		if ml == nil {
			if ml, err = net.Listen("tcp", l.cfg.MetricsListen); err != nil {
				return fmt.Errorf("metrics listen %s: %w", l.cfg.MetricsListen, err)
			}
		}
		l.mu.Lock()
		l.metricsAddr = ml.Addr()
		l.mu.Unlock()
		go l.serveMetrics(ctx, ml)
	}
	flushed := make(chan struct{})
	go func() {
		defer close(flushed)
		l.runFailureFlush(ctx)
	}()
	// before the store closes: the last failed proofs become events
	defer func() { <-flushed }()
	l.logger.Info("listening", "addr", l.addr.String(), "trustDomain", l.settings.TrustDomain, "caFingerprint", l.caFP)
	if l.cfg.Ready != nil {
		l.cfg.Ready(l.addr)
	}
	g.Go(func() error {
		every(gctx, time.Minute, l.limiters.forgetRefilled)
		return nil
	})
	g.Go(func() error {
		l.watchKeys(gctx)
		return nil
	})
	g.Go(func() error {
		l.sweepBudgets(gctx)
		return nil
	})

	g.Go(func() error {
		var wg sync.WaitGroup
		defer wg.Wait()
		for {
			conn, err := ln.Accept(gctx)
			if err != nil {
				if gctx.Err() != nil {
					return nil
				}
				return fmt.Errorf("accept: %w", err)
			}
			if h := l.cfg.hooks.Accepted; h != nil {
				h()
			}
			wg.Go(func() { l.serveConn(gctx, conn) })
		}
	})
	return g.Wait()
}

// every calls fn each period until ctx ends.
func every(ctx context.Context, period time.Duration, fn func()) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			fn()
		}
	}
}

// derivedKey derives a 32-byte transport key from the OPAQUE key file, so
// that listeners sharing a key directory share reset and token keys. A
// key file that cannot be read is an error: a key derived from nothing
// would be the same public constant on every listener.
func (l *Listener) derivedKey(label string) ([32]byte, error) {
	var k [32]byte
	raw, err := os.ReadFile(filepath.Join(l.keys.Path, opaqueKeyFile))
	if err != nil {
		return k, fmt.Errorf("derive %s key: %w", label, err)
	}
	if len(raw) == 0 {
		return k, fmt.Errorf("derive %s key: %s is empty", label, filepath.Join(l.keys.Path, opaqueKeyFile))
	}
	m := hmac.New(sha256.New, raw)
	m.Write([]byte(label))
	copy(k[:], m.Sum(nil))
	return k, nil
}

// The receive windows of a connection (see Run): at most connWindow bytes
// of a peer's data wait in the listener for each connection.
const (
	streamWindow = wire.MaxFrame + 1024
	connWindow   = 2 * streamWindow
)

var errTooManyConnections = errors.New("too many connections")

// burstConns connections served at once make a burst: a herd's
// connections leave the heap grown, and the Go runtime would hand that
// memory back to the OS only over minutes. Once no connection has ended
// for a second the listener returns it at once, for one full collection
// per burst; below this it does nothing, so a trickle of joins pays none.
const burstConns = 64

// resultGrace is how long the listener keeps a connection open after its
// last frame for the agent to read it and close: closing first would drop
// unacknowledged stream data, and a busy agent can be slow.
const resultGrace = 30 * time.Second

// connStarted and connEnded account for the connections served at once:
// a burst's connections, as they end, schedule the return of its memory.
func (l *Listener) connStarted() {
	if l.active.Add(1) >= burstConns {
		l.burst.Store(true)
	}
}

func (l *Listener) connEnded(held time.Duration) {
	l.active.Add(-1)
	if l.burst.Load() {
		l.burstMem.scheduleHeld(held)
	}
}

// closedHold is how long quic-go keeps a connection's state once it is
// closed: its IDs and a timer, for three probe timeouts (RFC 9002's PTO;
// twice the initial RTT of 100 ms before any sample).
func closedHold(conn *quic.Conn) time.Duration {
	s := conn.ConnectionStats()
	return ptoHold(s.SmoothedRTT, s.MeanDeviation)
}

func ptoHold(smoothedRTT, meanDeviation time.Duration) time.Duration {
	return 3 * max(smoothedRTT+max(4*meanDeviation, time.Millisecond), 200*time.Millisecond)
}

// burstReturned runs as a burst's memory is returned. Connections still
// open past burstConns (joins waiting for approval, say) belong to a burst
// that has not passed: their ends must return memory again, or what they
// held would stay with the listener after the last of them.
func (l *Listener) burstReturned() {
	l.burst.Store(l.active.Load() >= burstConns)
	l.limiters.forgetRefilled()
	l.releaseStorePages()
}

// releaseStorePages hands back the file pages a burst's joins read through
// the store's mapping (the bbolt backend's; etcd's has none), as the heap
// is handed back: a herd of 10,000 joins left some 60 MiB of them resident.
func (l *Listener) releaseStorePages() {
	if r, ok := store.Unwrap(l.store).(interface{ ReleasePages() error }); ok {
		if err := r.ReleasePages(); err != nil {
			l.logger.Debug("release the store's pages", "err", err)
		}
	}
}

func (l *Listener) serveConn(ctx context.Context, conn *quic.Conn) {
	l.connStarted()
	defer func() { l.connEnded(closedHold(conn)) }()
	handshakeOf(conn.Context()).release(true) // Accept returns it handshaken
	ctx = withRemote(ctx, conn.RemoteAddr())
	cs := conn.ConnectionState()
	alpn := cs.TLS.NegotiatedProtocol
	release, ok := l.slot(alpn)
	if !ok {
		conn.CloseWithError(quic.ApplicationErrorCode(wire.CloseBusy), "too many connections; try again later")
		return
	}
	defer release()
	stop := context.AfterFunc(ctx, func() { conn.CloseWithError(quic.ApplicationErrorCode(wire.CloseShutdown), "listener shutting down") })
	defer stop()
	// a connection earns its slot by opening its stream at once
	sctx, scancel := context.WithTimeout(ctx, l.cfg.FirstStream)
	opening := l.waitOnPeer()
	str, err := conn.AcceptStream(sctx)
	opening()
	scancel()
	if err != nil {
		conn.CloseWithError(quic.ApplicationErrorCode(wire.CloseProtocol), "no stream")
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	var code wire.CloseCode
	switch alpn {
	case wire.ALPNJoin:
		code = l.serveJoin(ctx, conn, str, cs)
	case wire.ALPNNode:
		code = l.renew(ctx, str, cs.TLS.PeerCertificates)
	default:
		conn.CloseWithError(quic.ApplicationErrorCode(wire.CloseProtocol), "")
		return
	}
	str.Close()
	// give the agent time to read the last frame before closing
	if code == wire.CloseDone {
		closing := l.waitOnPeer()
		select {
		case <-conn.Context().Done():
		case <-time.After(resultGrace):
		}
		closing()
	}
	conn.CloseWithError(quic.ApplicationErrorCode(code), "")
}

func (l *Listener) serveJoin(ctx context.Context, conn *quic.Conn, str *quic.Stream, cs quic.ConnectionState) wire.CloseCode {
	exporter, err := wire.Exporter(cs.TLS)
	if err != nil {
		return wire.CloseInternal
	}
	// the start is charged to its source once its Hello names a locator of
	// a shape that burns, with its count (Join, startBudget)
	ctx = withSource(ctx, sourceAddr(conn.RemoteAddr()))
	code, err := l.Join(ctx, str, exporter)
	if err != nil {
		l.logger.Debug("join ended", "remote", conn.RemoteAddr().String(), "err", err)
	}
	return code
}

// StoreTimeout is the deadline of each store call.
func (l *Listener) StoreTimeout() time.Duration { return l.cfg.StoreTimeout }

// Backup writes a consistent copy of the store to w as a bbolt file (see
// boltstore.Snapshot), while the listener serves.
func (l *Listener) Backup(ctx context.Context, w io.Writer) (int64, error) {
	return boltstore.Snapshot(ctx, l.store, l.cfg.DataDir, w)
}

// Healthy reports whether the store is sound: nil, or the damage a
// transaction met (the listener answers JOIN_UNAVAILABLE meanwhile).
func (l *Listener) Healthy() error {
	if h, ok := store.Unwrap(l.store).(interface{ Healthy() error }); ok {
		return h.Healthy()
	}
	return nil
}
