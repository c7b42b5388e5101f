// Package listener is the cluster's join listener: the QUIC endpoint that
// runs OPAQUE joins (ALPN stratum-join/1) and renewals (stratum-node/1),
// the owner of the CA and the OPAQUE keys, and the admin API on a unix
// socket. Its durable state lives in a store (package cluster); its keys
// live in a key directory; several listeners of one cluster share them
// through the store, sealed under a key-encryption key (docs/cluster.md).
//
// Layout of a data directory (0700):
//
//	listener.json   settings pinned at init: trust domain, endpoints, KSF
//	keys/           0700: ca.key ca.crt roots.pem listener.key listener.crt
//	                opaque.key (AKE key pair, OPRF seed, fake-record seed)
//	                cluster.kek (the key-encryption key of the cluster's keys)
//	state.db        the default bbolt store
package listener

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/stratumjoin/stratum/internal/cluster"
	"github.com/stratumjoin/stratum/internal/keyseal"
	"github.com/stratumjoin/stratum/internal/pake"
	"github.com/stratumjoin/stratum/internal/store"
	"github.com/stratumjoin/stratum/internal/wire"
	"github.com/stratumjoin/stratum/pki"
	"github.com/stratumjoin/stratum/pki/authority"
)

// DefaultPort is the join listener's UDP port.
const DefaultPort = wire.DefaultPort

// Settings are pinned at init in listener.json.
type Settings struct {
	TrustDomain  string         `json:"trustDomain"`
	Endpoints    []string       `json:"endpoints"`
	KSF          pake.KSFParams `json:"ksf"`
	NodeLifetime Duration       `json:"nodeLifetime"`
}

// Duration is a time.Duration that reads and writes as "168h0m0s".
type Duration time.Duration

func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	v, err := time.ParseDuration(s)
	*d = Duration(v)
	return err
}

const settingsFile = "listener.json"
const opaqueKeyFile = "opaque.key"

// InitConfig is what `stratum-listener init` takes.
type InitConfig struct {
	DataDir      string
	TrustDomain  string
	Endpoints    []string // host:port agents dial
	KSF          pake.KSFParams
	NodeLifetime time.Duration
	CACertPEM    []byte // optional: import this CA (root or intermediate chain)...
	CAKeyPEM     []byte // ...with this key
	Now          time.Time
	// StoreURL, when set, names the store several listeners share: init
	// seals the new cluster's keys into it, or refuses when it holds a
	// cluster already. Store, when set, is used instead of opening it.
	StoreURL string
	Store    store.Store
	// Join makes this listener one more of the cluster in the store: its
	// keys and settings come from the store, opened with the
	// key-encryption key in KEKFile. Trust domain, KSF, node lifetime and
	// an imported CA are the cluster's and may not be given.
	Join    bool
	KEKFile string
}

// ErrNotInitialized means the data directory holds no listener: init
// never ran there.
var ErrNotInitialized = errors.New("is not initialized")

// ErrAlreadyInitialized means the data directory holds a listener.
var ErrAlreadyInitialized = errors.New("data directory is already initialized")

// Init creates a listener's data directory: the CA (new, or imported), the
// listener's QUIC certificate, the OPAQUE keys, the key-encryption key and
// listener.json. With a store it also seals the keys into the store, and
// with Join it takes them from there (docs/cluster.md).
func Init(ctx context.Context, cfg InitConfig) (*authority.CA, error) {
	if cfg.DataDir == "" {
		return nil, errors.New("init: no data directory given")
	}
	if len(cfg.Endpoints) == 0 {
		cfg.Endpoints = []string{"127.0.0.1:" + DefaultPort}
	}
	for i, ep := range cfg.Endpoints {
		full, err := wire.Endpoint(ep)
		if err != nil {
			return nil, fmt.Errorf("init: --endpoint: %w", err)
		}
		cfg.Endpoints[i] = full
	}
	if cfg.Now.IsZero() {
		cfg.Now = time.Now()
	}
	if _, err := os.Stat(filepath.Join(cfg.DataDir, settingsFile)); err == nil {
		return nil, fmt.Errorf("init %s: %w", cfg.DataDir, ErrAlreadyInitialized)
	}
	var cl *cluster.Cluster
	if cfg.Store != nil || cfg.StoreURL != "" {
		st := cfg.Store
		if st == nil {
			var err error
			if st, err = store.Open(ctx, cfg.StoreURL); err != nil {
				return nil, fmt.Errorf("init: open store: %w", err)
			}
			defer st.Close()
		}
		cl = cluster.New(cluster.Config{Store: st})
	}
	if cfg.Join {
		if cl == nil {
			return nil, errors.New("init --join: no store given: name the cluster's store with --store")
		}
		return initJoin(ctx, cfg, cl)
	}
	var rev int64
	if cl != nil {
		rec, r, err := cl.SharedIdentity(ctx)
		if err != nil {
			return nil, fmt.Errorf("init: %w", err)
		}
		if r != 0 {
			pub, _ := publicIdentity(rec)
			return nil, &ClusterExistsError{CAFingerprint: pub.CAFingerprint, TrustDomain: pub.TrustDomain}
		}
		rev = r
	}
	if cfg.TrustDomain == "" {
		cfg.TrustDomain = "stratum.local"
	}
	if !pki.ValidTrustDomain(cfg.TrustDomain) {
		return nil, fmt.Errorf("init: invalid trust domain %q", cfg.TrustDomain)
	}
	if cfg.KSF == (pake.KSFParams{}) {
		cfg.KSF = pake.CodeKSF
	}
	// the pinned parameters are the join codes'; tokens and keys use none
	if err := cfg.KSF.CheckArgon2id(); err != nil {
		return nil, fmt.Errorf("init: %w", err)
	}
	if cfg.NodeLifetime == 0 {
		cfg.NodeLifetime = authority.DefaultNodeLifetime
	}
	keys := filepath.Join(cfg.DataDir, "keys")
	if err := makeDataDir(cfg.DataDir); err != nil {
		return nil, err
	}
	var ca *authority.CA
	var err error
	if cfg.CACertPEM != nil {
		ca, err = authority.ImportCA(cfg.CACertPEM, cfg.CAKeyPEM)
	} else {
		ca, err = authority.NewRootCA(cfg.TrustDomain, cfg.Now)
	}
	if err != nil {
		return nil, fmt.Errorf("init: %w", err)
	}
	dns, ips, err := authority.ListenerNames(cfg.Endpoints)
	if err != nil {
		return nil, fmt.Errorf("init: %w", err)
	}
	if _, err := (authority.KeyDir{Path: keys}).Init(ca, authority.ListenerConfig{TrustDomain: cfg.TrustDomain, DNSNames: dns, IPs: ips}, cfg.Now); err != nil {
		if errors.Is(err, authority.ErrInitialized) {
			return nil, fmt.Errorf("init %s: %w", cfg.DataDir, ErrAlreadyInitialized)
		}
		return nil, err
	}
	sk, err := pake.GenerateServerKeys()
	if err != nil {
		return nil, fmt.Errorf("init: %w", err)
	}
	if err := pki.WriteSecretFile(filepath.Join(keys, opaqueKeyFile), sk.Encode()); err != nil {
		return nil, fmt.Errorf("init: write opaque keys: %w", err)
	}
	kek, err := keyseal.NewKEK()
	if err != nil {
		return nil, fmt.Errorf("init: %w", err)
	}
	if err := pki.WriteSecretFile(filepath.Join(keys, KEKFile), kek.Encode()); err != nil {
		return nil, fmt.Errorf("init: write key-encryption key: %w", err)
	}
	settings := Settings{TrustDomain: cfg.TrustDomain, Endpoints: cfg.Endpoints, KSF: cfg.KSF, NodeLifetime: Duration(cfg.NodeLifetime)}
	if cl != nil {
		pub, sec, err := readLocalIdentity(keys, settings)
		if err != nil {
			return nil, fmt.Errorf("init: %w", err)
		}
		rec, err := sealIdentity(kek, pub, sec)
		if err != nil {
			return nil, fmt.Errorf("init: %w", err)
		}
		ok, err := cl.PutSharedIdentity(ctx, rec, rev, "", "", nil)
		if err != nil {
			return nil, fmt.Errorf("init: %w", err)
		}
		if !ok {
			return nil, errors.New("init: another listener made a cluster in this store at the same moment: remove this data directory and add it to that cluster with init --join")
		}
		if err := cl.AddEndpoints(ctx, cfg.Endpoints); err != nil {
			return nil, fmt.Errorf("init: %w", err)
		}
	}
	if err := writeSettings(cfg.DataDir, settings); err != nil {
		return nil, err
	}
	return ca, nil
}

func makeDataDir(dir string) error {
	if err := os.MkdirAll(filepath.Join(dir, "keys"), 0o700); err != nil {
		return fmt.Errorf("init: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("init: %w", err)
	}
	return nil
}

func writeSettings(dataDir string, s Settings) error {
	b, _ := json.MarshalIndent(s, "", "  ")
	if err := pki.WriteSecretFile(filepath.Join(dataDir, settingsFile), append(b, '\n')); err != nil {
		return fmt.Errorf("init: %w", err)
	}
	return nil
}

// initJoin makes a listener of the cluster whose sealed keys are in the
// store: the keys and settings are the cluster's, the listener certificate
// and endpoints its own.
func initJoin(ctx context.Context, cfg InitConfig, cl *cluster.Cluster) (*authority.CA, error) {
	if cfg.CACertPEM != nil {
		return nil, errors.New("init --join: the CA is the cluster's; --ca-cert does not apply")
	}
	if cfg.KEKFile == "" {
		return nil, errors.New("init --join: --kek FILE is required: the cluster's key-encryption key, copied from one of its listeners (keys/" + KEKFile + ")")
	}
	kek, err := keyseal.LoadKEK(cfg.KEKFile)
	if err != nil {
		return nil, fmt.Errorf("init --join: %w", err)
	}
	rec, rev, err := cl.SharedIdentity(ctx)
	if err != nil {
		return nil, fmt.Errorf("init --join: %w", err)
	}
	if rev == 0 {
		return nil, errors.New("init --join: the store holds no cluster yet: run init without --join (and with --store) on the first listener")
	}
	pub, sec, err := openIdentity(kek, rec)
	if err != nil {
		return nil, fmt.Errorf("init --join: open the cluster's keys with %s: %w", cfg.KEKFile, err)
	}
	if cfg.TrustDomain != "" && cfg.TrustDomain != pub.TrustDomain {
		return nil, fmt.Errorf("init --join: the cluster's trust domain is %s, not %s", pub.TrustDomain, cfg.TrustDomain)
	}
	keys := filepath.Join(cfg.DataDir, "keys")
	if err := makeDataDir(cfg.DataDir); err != nil {
		return nil, err
	}
	if _, err := os.Lstat(filepath.Join(keys, authority.CAKeyFile)); err == nil {
		return nil, fmt.Errorf("init %s: %w", cfg.DataDir, ErrAlreadyInitialized)
	}
	if err := writeLocalIdentity(keys, pub, sec); err != nil {
		return nil, fmt.Errorf("init --join: %w", err)
	}
	if err := pki.WriteSecretFile(filepath.Join(keys, KEKFile), kek.Encode()); err != nil {
		return nil, fmt.Errorf("init --join: write key-encryption key: %w", err)
	}
	kd := authority.KeyDir{Path: keys}
	ca, err := kd.LoadCA()
	if err != nil {
		return nil, fmt.Errorf("init --join: %w", err)
	}
	dns, ips, err := authority.ListenerNames(cfg.Endpoints)
	if err != nil {
		return nil, fmt.Errorf("init --join: %w", err)
	}
	if _, err := kd.IssueListenerCert(ca, authority.ListenerConfig{TrustDomain: pub.TrustDomain, DNSNames: dns, IPs: ips}, cfg.Now); err != nil {
		return nil, fmt.Errorf("init --join: %w", err)
	}
	if err := cl.AddEndpoints(ctx, cfg.Endpoints); err != nil {
		return nil, fmt.Errorf("init --join: %w", err)
	}
	settings := Settings{TrustDomain: pub.TrustDomain, Endpoints: cfg.Endpoints, KSF: pub.KSF, NodeLifetime: pub.NodeLifetime}
	if err := writeSettings(cfg.DataDir, settings); err != nil {
		return nil, err
	}
	return ca, nil
}

// LoadSettings reads listener.json.
func LoadSettings(dataDir string) (Settings, error) {
	var s Settings
	b, err := os.ReadFile(filepath.Join(dataDir, settingsFile))
	if errors.Is(err, os.ErrNotExist) {
		return s, fmt.Errorf("%s %w: run `stratum-listener init --data %s` first", dataDir, ErrNotInitialized, dataDir)
	}
	if err != nil {
		return s, fmt.Errorf("read settings: %w", err)
	}
	if err := json.Unmarshal(b, &s); err != nil {
		return s, fmt.Errorf("parse %s: %w", settingsFile, err)
	}
	if err := s.KSF.CheckArgon2id(); err != nil {
		return s, fmt.Errorf("%s: %w", settingsFile, err)
	}
	return s, nil
}

func certsDER(certs []*x509.Certificate) [][]byte {
	out := make([][]byte, len(certs))
	for i, c := range certs {
		out[i] = c.Raw
	}
	return out
}
