package agent

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/stratumjoin/stratum/internal/wire"
	"github.com/stratumjoin/stratum/pki"
)

// File names in the state directory (docs/architecture.md#parts).
const (
	KeyFile      = "node.key"
	CertFile     = "node.crt"
	CAFile       = "ca.pem"
	NodeFile     = "node.json"
	failuresFile = "failures.json"
	PendingFile  = "pending.json"
)

// Pending is pending.json: a join the listener holds for an
// administrator's approval, and the short authentication string the
// approver compares at this machine. It is removed once the node joined.
type Pending struct {
	JoinID   string    `json:"joinId"`
	SAS      string    `json:"sas"`
	Kind     string    `json:"kind"` // the secret's kind: join code, join token, join key
	Endpoint string    `json:"endpoint"`
	Since    time.Time `json:"since"`
}

func (s State) savePending(p Pending) error {
	if err := s.ensureDir(); err != nil {
		return err
	}
	b, _ := json.MarshalIndent(p, "", "  ")
	return pki.WriteFile(s.path(PendingFile), b, 0o600)
}

// Pending reads pending.json; ok is false when no join is pending.
func (s State) Pending() (p Pending, ok bool, err error) {
	b, err := os.ReadFile(s.path(PendingFile))
	if errors.Is(err, fs.ErrNotExist) {
		return p, false, nil
	}
	if err != nil {
		return p, false, err
	}
	if err := json.Unmarshal(b, &p); err != nil {
		return p, false, fmt.Errorf("parse %s: %w", PendingFile, err)
	}
	return p, true, nil
}

// Identity is node.json: what the agent knows about itself.
type Identity struct {
	NodeID   string `json:"nodeId"`
	Role     string `json:"role"`
	Trust    string `json:"trust"`
	Endpoint string `json:"endpoint"`
	// Endpoints are every listener the node may renew through, Endpoint
	// (the last that answered) first.
	Endpoints     []string  `json:"endpoints,omitempty"`
	TrustDomain   string    `json:"trustDomain"`
	CAFingerprint string    `json:"caFingerprint"`
	NotAfter      time.Time `json:"notAfter"`
	RenewAfter    time.Time `json:"renewAfter"`
	JoinedAt      time.Time `json:"joinedAt"`
	// LastRenewal and LastError are left out until there is one: an
	// absent value is never null or "" (docs/operations.md#json-output).
	LastRenewal *time.Time `json:"lastRenewal,omitempty"`
	LastError   string     `json:"lastError,omitempty"`
	Host        *wire.Host `json:"host,omitempty"`
	// TPM locates the TPM that holds the node key; "" for a key file.
	TPM string `json:"tpm,omitempty"`
}

// State is the agent's state directory (0700).
type State struct{ Dir string }

func (s State) path(name string) string { return filepath.Join(s.Dir, name) }

// ensureDir creates the directory 0700, or tightens an existing one.
func (s State) ensureDir() error {
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return fmt.Errorf("state directory: %w", err)
	}
	if err := os.Chmod(s.Dir, 0o700); err != nil {
		return fmt.Errorf("state directory: %w", err)
	}
	return nil
}

// Key returns the node key, generating it on first use. It never leaves
// this directory: only CSRs signed with it do.
func (s State) Key() (crypto.Signer, error) {
	key, fresh, err := s.loadKey()
	if err != nil || fresh == nil {
		return key, err
	}
	if err := pki.WriteSecretFile(s.path(KeyFile), fresh.Data); err != nil {
		return nil, fmt.Errorf("write node key: %w", err)
	}
	return key, nil
}

// loadKey reads the node key or, when there is none, generates one and
// returns it with the file that holds it, for the caller to write: a join
// writes it in one batch with its attempt nonce, before the CSR leaves.
func (s State) loadKey() (crypto.Signer, *pki.File, error) {
	if err := s.ensureDir(); err != nil {
		return nil, nil, err
	}
	b, err := os.ReadFile(s.path(KeyFile))
	if err == nil {
		key, err := pki.ParsePrivateKeyPEM(b)
		return key, nil, err
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, nil, fmt.Errorf("read node key: %w", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate node key: %w", err)
	}
	pemBytes, err := pki.MarshalPrivateKeyPEM(key)
	if err != nil {
		return nil, nil, err
	}
	return key, &pki.File{Name: KeyFile, Data: pemBytes, Mode: 0o600}, nil
}

// CSR makes a certificate request for the node key. It asks for nothing:
// the listener decides every name.
func CSR(key crypto.Signer) ([]byte, error) {
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "stratum-node"}}, key)
	if err != nil {
		return nil, fmt.Errorf("create csr: %w", err)
	}
	return der, nil
}

// Identity reads node.json; ok is false when the agent has not joined.
func (s State) Identity() (id Identity, ok bool, err error) {
	b, err := os.ReadFile(s.path(NodeFile))
	if errors.Is(err, fs.ErrNotExist) {
		return id, false, nil
	}
	if err != nil {
		return id, false, fmt.Errorf("read %s: %w", NodeFile, err)
	}
	if err := json.Unmarshal(b, &id); err != nil {
		return id, false, fmt.Errorf("parse %s: %w", NodeFile, err)
	}
	return id, true, nil
}

// saveIdentity writes node.json atomically.
func (s State) saveIdentity(id Identity) error {
	b, err := json.MarshalIndent(id, "", "  ")
	if err != nil {
		return err
	}
	return pki.WriteFile(s.path(NodeFile), append(b, '\n'), 0o600)
}

// saveCredentials writes node.crt, ca.pem and then node.json, each
// atomically and with one directory sync: a crash leaves either the old
// identity or the new one. With a locator (a join), the locator's attempt
// nonces go in the same batch: a proof of the code was recorded, so they
// can claim nothing back. When they were all attempts.json held, the file
// is removed before the batch, and the batch's directory sync makes the
// removal durable with the rest: no file of its own to sync. A crash that
// keeps the removal but loses the identity loses nothing, since the nonces
// were spent.
func (s State) saveCredentials(chain, roots []*x509.Certificate, id Identity, locator string) error {
	b, err := json.MarshalIndent(id, "", "  ")
	if err != nil {
		return err
	}
	files := []pki.File{
		{Name: CertFile, Data: pki.EncodeCertsPEM(chain), Mode: 0o644},
		{Name: CAFile, Data: pki.EncodeCertsPEM(roots), Mode: 0o644},
	}
	if locator != "" {
		m, err := s.readAttempts()
		if err != nil {
			return err
		}
		if _, ok := m[locator]; ok {
			delete(m, locator)
			if len(m) == 0 {
				if err := os.Remove(s.path(attemptsFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
					return fmt.Errorf("forget attempt nonces: %w", err)
				}
			} else {
				a, err := json.Marshal(m)
				if err != nil {
					return err
				}
				files = append(files, pki.File{Name: attemptsFile, Data: a, Mode: 0o600})
			}
		}
	}
	// node.json last: it is the commit marker
	files = append(files, pki.File{Name: NodeFile, Data: append(b, '\n'), Mode: 0o600})
	if err := pki.WriteFiles(s.Dir, files); err != nil {
		return fmt.Errorf("write node identity: %w", err)
	}
	if err := os.Remove(s.path(PendingFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", PendingFile, err)
	}
	return nil
}

// Roots reads the pinned CA bundle.
func (s State) Roots() ([]*x509.Certificate, error) {
	b, err := os.ReadFile(s.path(CAFile))
	if err != nil {
		return nil, fmt.Errorf("read pinned ca: %w", err)
	}
	return pki.ParseCertsPEM(b)
}

// Chain reads node.crt.
func (s State) Chain() ([]*x509.Certificate, error) {
	b, err := os.ReadFile(s.path(CertFile))
	if err != nil {
		return nil, fmt.Errorf("read node certificate: %w", err)
	}
	return pki.ParseCertsPEM(b)
}

// failures counts PAKE failures per locator (public), so a service that
// restarts does not keep spending a code's attempts. A file that cannot be
// read or decoded is an error, never a count of 0: the give-up counter
// fails closed.
func (s State) failures(locator string) (int, error) {
	m, err := s.readFailures()
	return m[locator], err
}

func (s State) readFailures() (map[string]int, error) {
	m := map[string]int{}
	b, err := os.ReadFile(s.path(failuresFile))
	if errors.Is(err, fs.ErrNotExist) {
		return m, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the give-up counter: %w", err)
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("the give-up counter %s is corrupt (delete it to start counting again): %w", s.path(failuresFile), err)
	}
	return m, nil
}

func (s State) setFailures(locator string, n int) error {
	m, err := s.readFailures()
	if err != nil {
		return err
	}
	if n == 0 {
		if _, ok := m[locator]; !ok {
			return nil // nothing to forget: spare the disk a write
		}
		delete(m, locator)
	} else {
		m[locator] = n
	}
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	if err := pki.WriteFile(s.path(failuresFile), b, 0o600); err != nil {
		return fmt.Errorf("record the give-up counter: %w", err)
	}
	return nil
}
