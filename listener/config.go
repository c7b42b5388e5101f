// Package listener is the cluster's join listener: the QUIC endpoint that
// runs OPAQUE joins (ALPN stratum-join/1) and renewals (stratum-node/1),
// the owner of the CA and the OPAQUE keys, and the admin API on a unix
// socket. Its durable state lives in a store (package cluster); its keys
// live in a key directory and never in the store.
//
// Layout of a data directory (0700):
//
//	listener.json   settings pinned at init: trust domain, endpoints, KSF
//	keys/           0700: ca.key ca.crt roots.pem listener.key listener.crt
//	                opaque.key (AKE key pair, OPRF seed, fake-record seed)
//	state.db        the default bbolt store
package listener

import (
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/stratumjoin/stratum/internal/pake"
	"github.com/stratumjoin/stratum/pki"
)

// DefaultPort is the join listener's UDP port.
const DefaultPort = "9444"

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
}

// ErrAlreadyInitialized means the data directory holds a listener.
var ErrAlreadyInitialized = errors.New("data directory is already initialized")

// Init creates a listener's data directory: the CA (new, or imported), the
// listener's QUIC certificate, the OPAQUE keys and listener.json.
func Init(cfg InitConfig) (*pki.CA, error) {
	if cfg.DataDir == "" {
		return nil, errors.New("init: no data directory given")
	}
	if cfg.TrustDomain == "" {
		cfg.TrustDomain = "stratum.local"
	}
	if !pki.ValidTrustDomain(cfg.TrustDomain) {
		return nil, fmt.Errorf("init: invalid trust domain %q", cfg.TrustDomain)
	}
	if len(cfg.Endpoints) == 0 {
		cfg.Endpoints = []string{"127.0.0.1:" + DefaultPort}
	}
	for _, ep := range cfg.Endpoints {
		if _, _, err := net.SplitHostPort(ep); err != nil {
			return nil, fmt.Errorf("init: endpoint %q is not host:port: %w", ep, err)
		}
	}
	if cfg.KSF == (pake.KSFParams{}) {
		cfg.KSF = pake.CodeKSF
	}
	// the pinned parameters are the join codes'; tokens and keys use none
	if err := cfg.KSF.CheckArgon2id(); err != nil {
		return nil, fmt.Errorf("init: %w", err)
	}
	if cfg.NodeLifetime == 0 {
		cfg.NodeLifetime = pki.DefaultNodeLifetime
	}
	if cfg.Now.IsZero() {
		cfg.Now = time.Now()
	}
	if _, err := os.Stat(filepath.Join(cfg.DataDir, settingsFile)); err == nil {
		return nil, fmt.Errorf("init %s: %w", cfg.DataDir, ErrAlreadyInitialized)
	}
	keys := filepath.Join(cfg.DataDir, "keys")
	if err := os.MkdirAll(keys, 0o700); err != nil {
		return nil, fmt.Errorf("init: %w", err)
	}
	if err := os.Chmod(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("init: %w", err)
	}
	var ca *pki.CA
	var err error
	if cfg.CACertPEM != nil {
		ca, err = pki.ImportCA(cfg.CACertPEM, cfg.CAKeyPEM)
	} else {
		ca, err = pki.NewRootCA(cfg.TrustDomain, cfg.Now)
	}
	if err != nil {
		return nil, fmt.Errorf("init: %w", err)
	}
	dns, ips, err := pki.ListenerNames(cfg.Endpoints)
	if err != nil {
		return nil, fmt.Errorf("init: %w", err)
	}
	if _, err := (pki.KeyDir{Path: keys}).Init(ca, pki.ListenerConfig{TrustDomain: cfg.TrustDomain, DNSNames: dns, IPs: ips}, cfg.Now); err != nil {
		if errors.Is(err, pki.ErrInitialized) {
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
	b, _ := json.MarshalIndent(Settings{TrustDomain: cfg.TrustDomain, Endpoints: cfg.Endpoints, KSF: cfg.KSF, NodeLifetime: Duration(cfg.NodeLifetime)}, "", "  ")
	if err := pki.WriteSecretFile(filepath.Join(cfg.DataDir, settingsFile), append(b, '\n')); err != nil {
		return nil, fmt.Errorf("init: %w", err)
	}
	return ca, nil
}

// LoadSettings reads listener.json.
func LoadSettings(dataDir string) (Settings, error) {
	var s Settings
	b, err := os.ReadFile(filepath.Join(dataDir, settingsFile))
	if errors.Is(err, os.ErrNotExist) {
		return s, fmt.Errorf("%s is not initialized: run `stratum-listener init --data %s` first", dataDir, dataDir)
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
