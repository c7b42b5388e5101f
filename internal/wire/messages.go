package wire

import (
	"errors"
	"fmt"
	"regexp"
)

var locatorRE = regexp.MustCompile(`^[A-Za-z0-9_-]{2,64}$`)

// Hello opens a join: which record, and the first OPAQUE message.
type Hello struct {
	Version uint   `cbor:"1,keyasint"`
	Locator string `cbor:"2,keyasint"`
	KE1     []byte `cbor:"3,keyasint"`
	// Attempt is the agent's commitment for this attempt, SHA-256 of a
	// nonce it keeps on disk: a later Proof that reveals the nonce gets
	// the attempt back if it was orphaned (never proven).
	Attempt []byte `cbor:"4,keyasint,omitempty"`
}

func (*Hello) Type() byte { return TypeHello }

func (m *Hello) Check() error {
	switch {
	case m.Version != Version:
		return fmt.Errorf("protocol version %d, this listener speaks %d", m.Version, Version)
	case !locatorRE.MatchString(m.Locator):
		return errors.New("malformed locator")
	case len(m.KE1) != KE1Size:
		return fmt.Errorf("KE1 is %d bytes, want %d", len(m.KE1), KE1Size)
	case len(m.Attempt) != 0 && len(m.Attempt) != AttemptSize:
		return fmt.Errorf("attempt commitment is %d bytes, want %d", len(m.Attempt), AttemptSize)
	}
	return nil
}

// AttemptSize is the size of an attempt commitment and of its nonce.
const AttemptSize = 32

// MaxRefunds bounds the nonces one Proof reveals.
const MaxRefunds = 16

// Challenge answers Hello. CAChain holds the CA certificates (DER) the
// record was minted under, issuing CA first and root last; the agent
// derives the OPAQUE server identity from the root. KSF are the key
// stretching parameters the record was minted with.
type Challenge struct {
	KE2     []byte    `cbor:"1,keyasint"`
	CAChain [][]byte  `cbor:"2,keyasint"`
	KSF     KSFParams `cbor:"3,keyasint"`
}

func (*Challenge) Type() byte { return TypeChallenge }

func (m *Challenge) Check() error {
	if len(m.KE2) != KE2Size {
		return fmt.Errorf("KE2 is %d bytes, want %d", len(m.KE2), KE2Size)
	}
	if err := checkCerts("caChain", m.CAChain); err != nil {
		return err
	}
	return m.KSF.Check()
}

// Proof finishes the PAKE and asks for a certificate for the CSR's key.
// TPM, when present, offers to prove that the key lives in a TPM: the
// listener then answers with a TPMChallenge before the Result.
type Proof struct {
	KE3   []byte `cbor:"1,keyasint"`
	CSR   []byte `cbor:"2,keyasint"`
	Facts Facts  `cbor:"3,keyasint"`
	// Refunds are the nonces of the agent's earlier attempts with this
	// code that it never saw finish (at most MaxRefunds).
	Refunds [][]byte  `cbor:"4,keyasint,omitempty"`
	TPM     *TPMClaim `cbor:"5,keyasint,omitempty"`
}

// TPMClaim names the TPM and the keys an attestation is about, in the
// TPM's own encodings (see docs/tpm.md): the endorsement key (EK) public
// area and its certificate (DER; absent when the TPM holds none), the
// attestation key's and the node key's public areas.
type TPMClaim struct {
	EKPublic  []byte `cbor:"1,keyasint"`
	EKCert    []byte `cbor:"2,keyasint,omitempty"`
	AKPublic  []byte `cbor:"3,keyasint"`
	KeyPublic []byte `cbor:"4,keyasint"`
}

func (c *TPMClaim) check() error {
	for _, f := range []struct {
		name string
		b    []byte
		max  int
	}{{"ekPublic", c.EKPublic, 1024}, {"akPublic", c.AKPublic, 1024}, {"keyPublic", c.KeyPublic, 1024}} {
		if len(f.b) == 0 || len(f.b) > f.max {
			return fmt.Errorf("tpm %s is %d bytes, want 1..%d", f.name, len(f.b), f.max)
		}
	}
	if len(c.EKCert) > 4<<10 {
		return fmt.Errorf("tpm ekCert is %d bytes, want at most 4096", len(c.EKCert))
	}
	return nil
}

// TPMChallenge is the listener's credential for the claimed EK and AK,
// and the nonce the node key's certification must carry.
type TPMChallenge struct {
	Credential []byte `cbor:"1,keyasint"`
	Secret     []byte `cbor:"2,keyasint"`
	Nonce      []byte `cbor:"3,keyasint"`
}

func (*TPMChallenge) Type() byte { return TypeTPMChallenge }

func (m *TPMChallenge) Check() error {
	if len(m.Credential) == 0 || len(m.Credential) > 1024 || len(m.Secret) == 0 || len(m.Secret) > 1024 || len(m.Nonce) != 32 {
		return errors.New("tpm challenge fields out of bounds")
	}
	return nil
}

// TPMAnswer is the activated secret, and TPMS_ATTEST of TPM2_Certify of
// the node key by the attestation key with its TPMT_SIGNATURE.
type TPMAnswer struct {
	Secret      []byte `cbor:"1,keyasint"`
	CertifyInfo []byte `cbor:"2,keyasint"`
	Signature   []byte `cbor:"3,keyasint"`
}

func (*TPMAnswer) Type() byte { return TypeTPMAnswer }

func (m *TPMAnswer) Check() error {
	if len(m.Secret) == 0 || len(m.Secret) > 64 || len(m.CertifyInfo) == 0 || len(m.CertifyInfo) > 1024 || len(m.Signature) == 0 || len(m.Signature) > 1024 {
		return errors.New("tpm answer fields out of bounds")
	}
	return nil
}

func (*Proof) Type() byte { return TypeProof }

func (m *Proof) Check() error {
	switch {
	case len(m.KE3) != KE3Size:
		return fmt.Errorf("KE3 is %d bytes, want %d", len(m.KE3), KE3Size)
	case len(m.CSR) == 0 || len(m.CSR) > 8<<10:
		return fmt.Errorf("CSR is %d bytes, want 1..8192", len(m.CSR))
	case len(m.Refunds) > MaxRefunds:
		return fmt.Errorf("%d refund nonces, at most %d", len(m.Refunds), MaxRefunds)
	}
	for _, n := range m.Refunds {
		if len(n) != AttemptSize {
			return fmt.Errorf("refund nonce is %d bytes, want %d", len(n), AttemptSize)
		}
	}
	if m.TPM != nil {
		if err := m.TPM.check(); err != nil {
			return err
		}
	}
	return m.Facts.Check()
}

// Renew asks for a fresh certificate over a mutually authenticated
// ALPNNode connection.
type Renew struct {
	CSR []byte `cbor:"1,keyasint"`
}

func (*Renew) Type() byte { return TypeRenew }

func (m *Renew) Check() error {
	if len(m.CSR) == 0 || len(m.CSR) > 8<<10 {
		return fmt.Errorf("CSR is %d bytes, want 1..8192", len(m.CSR))
	}
	return nil
}

// Leave asks, over a mutually authenticated ALPNNode connection, that the
// node presenting the certificate be revoked: the node leaves the cluster.
// It has no fields; the certificate names the node.
type Leave struct{}

func (*Leave) Type() byte { return TypeLeave }

func (*Leave) Check() error { return nil }

// Result statuses.
const (
	StatusJoined  = "joined"
	StatusPending = "pending"
	StatusRefused = "refused"
	// StatusLeft answers a Leave: the node is revoked.
	StatusLeft = "left"
)

// Refusal codes a Result carries. Before a proven PAKE nothing is ever
// refused by name: the stream is just closed.
const (
	CodeStale            = "JOIN_CODE_STALE"
	CodeExpired          = "JOIN_CODE_EXPIRED"
	CodeRevoked          = "JOIN_CODE_REVOKED"
	CodeUsedUp           = "JOIN_CODE_USED_UP"
	CodeIdentityMismatch = "JOIN_IDENTITY_MISMATCH"
	CodeNodeExists       = "NODE_EXISTS"
	CodeApprovalRefused  = "JOIN_APPROVAL_REFUSED"
	CodeBadCSR           = "CSR_INVALID"
	CodeNodeRevoked      = "NODE_REVOKED"
	CodeNodeUnknown      = "NODE_UNKNOWN"
	CodeCertInvalid      = "NODE_CERT_INVALID"
	CodeAddressExhausted = "ADDRESS_POOL_EXHAUSTED"
	// CodeUnavailable: the listener cannot reach its store (no answer
	// within its deadline, a full disk, a damaged file). It is the one
	// refusal a listener sends before the PAKE, in place of a Challenge,
	// since it says nothing about the code; it is retryable, after
	// Result.RetryAfter seconds.
	CodeUnavailable = "JOIN_UNAVAILABLE"
	// CodeRateLimited answers, before any KE2 and whatever the locator, a
	// start from a source that spent its budget of unproven starts; the
	// Result's RetryAfter says when to come back.
	CodeRateLimited = "JOIN_RATE_LIMITED"
	// CodeCertExpired refuses a renewal whose certificate expired longer
	// ago than the listener's renewal grace: the node needs a new code.
	CodeCertExpired = "NODE_CERT_EXPIRED"
	// CodeTPMRequired: the pool requires TPM attestation and the join
	// offered none, or its attestation did not verify.
	CodeTPMRequired = "JOIN_TPM_REQUIRED"
	// CodeTPMKeyChanged: an attested node asked to renew into a key
	// other than the one its TPM attested.
	CodeTPMKeyChanged = "TPM_KEY_CHANGED"
)

// Retryable reports whether a refusal code is transient.
func Retryable(code string) bool { return code == CodeUnavailable || code == CodeRateLimited }

// Host is what a join key assigns (the join-keys API, docs/api.md): network, role, tags, the
// overlay addresses and the host name.
type Host struct {
	Name      string   `cbor:"1,keyasint" json:"name"`
	NetworkID string   `cbor:"2,keyasint" json:"networkID"`
	RoleID    string   `cbor:"3,keyasint,omitempty" json:"roleID,omitempty"`
	Tags      []string `cbor:"4,keyasint,omitempty" json:"tags,omitempty"`
	Addresses []string `cbor:"5,keyasint,omitempty" json:"addresses,omitempty"`
}

// Result ends a join or a renewal, or says it is pending.
type Result struct {
	Status     string   `cbor:"1,keyasint"`
	Code       string   `cbor:"2,keyasint,omitempty"`
	Message    string   `cbor:"3,keyasint,omitempty"`
	JoinID     string   `cbor:"4,keyasint,omitempty"`
	NodeID     string   `cbor:"5,keyasint,omitempty"`
	CertChain  [][]byte `cbor:"6,keyasint,omitempty"`
	CABundle   [][]byte `cbor:"7,keyasint,omitempty"`
	Role       string   `cbor:"8,keyasint,omitempty"`
	Trust      string   `cbor:"9,keyasint,omitempty"`
	RenewAfter int64    `cbor:"10,keyasint,omitempty"` // unix seconds
	Host       *Host    `cbor:"11,keyasint,omitempty"`
	// SAS is the short authentication string of a pending join: six
	// digits both ends derive from the PAKE session key and the join id.
	// The agent checks it against its own and prints it.
	SAS string `cbor:"12,keyasint,omitempty"`
	// RetryAfter is how many seconds to wait before retrying a retryable
	// refusal (JOIN_UNAVAILABLE, JOIN_RATE_LIMITED).
	RetryAfter int64 `cbor:"13,keyasint,omitempty"`
	// PendingFor is how many seconds the listener holds a pending join
	// open; the agent waits that long for the next Result.
	PendingFor int64 `cbor:"14,keyasint,omitempty"`
}

func (*Result) Type() byte { return TypeResult }

func (m *Result) Check() error {
	if len(m.Message) > 1024 || len(m.Code) > 64 || len(m.JoinID) > 64 || len(m.NodeID) > 64 || len(m.SAS) > 16 {
		return errors.New("oversized field")
	}
	if m.RetryAfter < 0 || m.RetryAfter > 86400 || m.PendingFor < 0 || m.PendingFor > 7*86400 {
		return errors.New("retryAfter or pendingFor out of range")
	}
	switch m.Status {
	case StatusJoined:
		if m.NodeID == "" || m.Role == "" || m.Trust == "" || m.RenewAfter <= 0 {
			return errors.New("joined result lacks node id, role, trust or renewal time")
		}
		if err := checkCerts("certChain", m.CertChain); err != nil {
			return err
		}
		return checkCerts("caBundle", m.CABundle)
	case StatusPending:
		if m.JoinID == "" {
			return errors.New("pending result lacks a join id")
		}
	case StatusRefused:
		if m.Code == "" {
			return errors.New("refused result lacks a code")
		}
	case StatusLeft:
		if m.NodeID == "" {
			return errors.New("left result lacks a node id")
		}
	default:
		return fmt.Errorf("unknown status %q", m.Status)
	}
	return nil
}

func checkCerts(name string, certs [][]byte) error {
	if len(certs) == 0 || len(certs) > 8 {
		return fmt.Errorf("%s has %d certificates, want 1..8", name, len(certs))
	}
	for _, c := range certs {
		if len(c) == 0 || len(c) > 8<<10 {
			return fmt.Errorf("%s holds a certificate of %d bytes", name, len(c))
		}
	}
	return nil
}

// Check bounds the claimed facts.
func (f *Facts) Check() error {
	for _, s := range []string{f.ProductUUID, f.Serial, f.BoardSerial, f.Vendor, f.ProductName, f.Hostname} {
		if len(s) > 256 {
			return errors.New("fact longer than 256 bytes")
		}
	}
	if len(f.MACs) > 64 || len(f.GPUUUIDs) > 64 {
		return errors.New("too many MACs or GPUs")
	}
	for _, s := range append(append([]string(nil), f.MACs...), f.GPUUUIDs...) {
		if len(s) > 128 {
			return errors.New("fact longer than 128 bytes")
		}
	}
	return nil
}
