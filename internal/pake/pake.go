// Package pake is Stratum Join's use of OPAQUE (RFC 9807, bytemare/opaque
// v0.18.0): minting a record from a join secret on the listener, the server
// half of a login (KE1 -> KE2, KE3 check) and the client half (KE1, KE2 ->
// KE3).
//
// Two bindings make a login more than a password check:
//   - the server identity is the SHA-256 of the cluster root CA, baked into
//     the record at mint, so a successful login proves to the agent which CA
//     the listener holds, and a CA rotation makes old records stale;
//   - the AKE context is "stratum-join/1" followed by the TLS exporter of the
//     QUIC connection carrying the login, so a relay that terminates TLS on
//     both sides makes the two MACs disagree.
//
// The client identity is the locator, so a record answers only to the
// locator it was minted for.
package pake

import (
	"crypto/hmac"
	"crypto/sha512"
	"errors"
	"fmt"

	"github.com/bytemare/ecc"
	"github.com/bytemare/ksf"
	"github.com/bytemare/opaque"
	"github.com/bytemare/opaque/message"
)

// ContextLabel starts every AKE context.
const ContextLabel = "stratum-join/1"

// Sizes of the messages on the wire with the suite we use
// (ristretto255, SHA-512).
const (
	KE1Size    = 96
	KE2Size    = 320
	KE3Size    = 64
	RecordSize = 192
)

// KSFParams are Argon2id's time, memory (KiB) and threads. The listener
// pins them in its configuration and records them per secret; the agent
// receives them in the Challenge and refuses values outside the bounds
// below.
type KSFParams struct {
	Time      uint32 `json:"time" cbor:"1,keyasint"`
	MemoryKiB uint32 `json:"memoryKiB" cbor:"2,keyasint"`
	Threads   uint8  `json:"threads" cbor:"3,keyasint"`
}

// DefaultKSF is Argon2id as bytemare/ksf defaults it (and RFC 9106's
// second recommendation): 3 passes over 64 MiB with 4 lanes.
var DefaultKSF = KSFParams{Time: 3, MemoryKiB: 64 * 1024, Threads: 4}

// LightestKSF is the cheapest setting a listener accepts or an agent
// computes: still memory-hard, for test fleets and constrained machines.
var LightestKSF = KSFParams{Time: 1, MemoryKiB: 8 * 1024, Threads: 1}

// maxKSFMemoryKiB bounds what a (possibly fake) listener can make an agent
// allocate.
const maxKSFMemoryKiB = 1024 * 1024

// Check validates the parameters against the accepted bounds.
func (p KSFParams) Check() error {
	switch {
	case p.Time < LightestKSF.Time || p.Time > 16:
		return fmt.Errorf("argon2id time %d outside %d..16", p.Time, LightestKSF.Time)
	case p.MemoryKiB < LightestKSF.MemoryKiB || p.MemoryKiB > maxKSFMemoryKiB:
		return fmt.Errorf("argon2id memory %d KiB outside %d..%d", p.MemoryKiB, LightestKSF.MemoryKiB, maxKSFMemoryKiB)
	case p.Threads < 1 || p.Threads > 16:
		return fmt.Errorf("argon2id threads %d outside 1..16", p.Threads)
	}
	return nil
}

func (p KSFParams) clientOptions() *opaque.ClientOptions {
	return &opaque.ClientOptions{KSFParameters: []uint64{uint64(p.Time), uint64(p.MemoryKiB), uint64(p.Threads)}}
}

// ErrNotAccepted is the only thing either side learns from a failed login:
// a wrong secret, a wrong CA, a relay and a fake listener look the same.
var ErrNotAccepted = errors.New("code not accepted, or the listener is not authentic")

func configuration(ctx []byte) *opaque.Configuration {
	conf := opaque.DefaultConfiguration()
	conf.KSF = ksf.Argon2id
	conf.Context = ctx
	return conf
}

// BindingContext is the AKE context for a connection whose TLS exporter
// (RFC 9266, 32 bytes) is exporter.
func BindingContext(exporter []byte) []byte {
	return append([]byte(ContextLabel), exporter...)
}

// ServerKeys are the listener's long-term OPAQUE secrets. They live in the
// key directory, never in the store: with them and a record, anyone can
// test guesses offline.
type ServerKeys struct {
	material *opaque.ServerKeyMaterial
	fakeSeed []byte
}

// GenerateServerKeys makes a fresh AKE key pair, OPRF seed and fake-record seed.
func GenerateServerKeys() (*ServerKeys, error) {
	conf := configuration(nil)
	sk, pk := conf.KeyGen()
	return &ServerKeys{
		material: &opaque.ServerKeyMaterial{PrivateKey: sk, PublicKeyBytes: pk.Encode(), OPRFGlobalSeed: conf.GenerateOPRFSeed(), Identity: []byte(ContextLabel)},
		fakeSeed: opaque.RandomBytes(64),
	}, nil
}

// Encode serialises the keys for the 0600 key file.
func (k *ServerKeys) Encode() []byte {
	m := k.material.Encode()
	out := make([]byte, 0, 2+len(m)+len(k.fakeSeed))
	out = append(out, byte(len(m)>>8), byte(len(m)))
	out = append(out, m...)
	return append(out, k.fakeSeed...)
}

// DecodeServerKeys parses Encode's output.
func DecodeServerKeys(b []byte) (*ServerKeys, error) {
	if len(b) < 2 {
		return nil, errors.New("opaque key file too short")
	}
	n := int(b[0])<<8 | int(b[1])
	if len(b) != 2+n+64 {
		return nil, errors.New("opaque key file has the wrong length")
	}
	m, err := configuration(nil).DecodeServerKeyMaterial(b[2 : 2+n])
	if err != nil {
		return nil, fmt.Errorf("decode opaque server key material: %w", err)
	}
	return &ServerKeys{material: m, fakeSeed: append([]byte(nil), b[2+n:]...)}, nil
}

// server returns a login server for one connection: the context carries
// its TLS exporter, the identity the CA fingerprint the record was minted
// under.
func (k *ServerKeys) server(ctx, serverID []byte) (*opaque.Server, error) {
	srv, err := configuration(ctx).Server()
	if err != nil {
		return nil, fmt.Errorf("opaque server: %w", err)
	}
	m := *k.material
	m.Identity = serverID
	if err := srv.SetKeyMaterial(&m); err != nil {
		return nil, fmt.Errorf("opaque key material: %w", err)
	}
	return srv, nil
}

// Mint runs both halves of a registration in-process and returns the
// record; the password is not kept. serverID is the CA fingerprint.
func (k *ServerKeys) Mint(locator string, password, serverID []byte, p KSFParams) ([]byte, error) {
	if err := p.Check(); err != nil {
		return nil, err
	}
	srv, err := k.server(nil, serverID)
	if err != nil {
		return nil, err
	}
	c, err := configuration(nil).Client()
	if err != nil {
		return nil, fmt.Errorf("opaque client: %w", err)
	}
	defer c.ClearState()
	req, err := c.RegistrationInit(password)
	if err != nil {
		return nil, fmt.Errorf("registration init: %w", err)
	}
	resp, err := srv.RegistrationResponse(req, []byte(locator), nil)
	if err != nil {
		return nil, fmt.Errorf("registration response: %w", err)
	}
	rec, _, err := c.RegistrationFinalize(resp, []byte(locator), serverID, p.clientOptions())
	if err != nil {
		return nil, fmt.Errorf("registration finalize: %w", err)
	}
	return rec.Serialize(), nil
}

// fakeRecord is stable per locator, so probing an unknown locator twice
// with the same blinded element gets the same evaluation, exactly as a real
// record does.
func (k *ServerKeys) fakeRecord(locator string) *message.RegistrationRecord {
	mac := hmac.New(sha512.New, k.fakeSeed)
	mac.Write([]byte("stratum-join fake record\x00"))
	mac.Write([]byte(locator))
	sum := mac.Sum(nil)
	g := ecc.Ristretto255Sha512
	scalar := g.HashToScalar(sum[:32], []byte("stratum-join-fake-v1"))
	mk := hmac.New(sha512.New, k.fakeSeed)
	mk.Write([]byte("stratum-join fake masking key\x00"))
	mk.Write([]byte(locator))
	return &message.RegistrationRecord{
		ClientPublicKey: g.Base().Multiply(scalar),
		MaskingKey:      mk.Sum(nil),
		Envelope:        make([]byte, 96),
	}
}

// ServerLogin is the listener's state for one login between KE2 and KE3.
type ServerLogin struct {
	srv       *opaque.Server
	clientMAC []byte
}

// Respond answers KE1 for locator with the record minted under serverID.
// record nil means the locator is unknown: a fake record answers,
// indistinguishable before KE3.
func (k *ServerKeys) Respond(bindingCtx, serverID []byte, locator string, ke1 []byte, record []byte) (ke2 []byte, login *ServerLogin, err error) {
	srv, err := k.server(bindingCtx, serverID)
	if err != nil {
		return nil, nil, err
	}
	m1, err := srv.Deserialize.KE1(ke1)
	if err != nil {
		return nil, nil, fmt.Errorf("decode KE1: %w", err)
	}
	var rr *message.RegistrationRecord
	if record == nil {
		rr = k.fakeRecord(locator)
	} else if rr, err = srv.Deserialize.RegistrationRecord(record); err != nil {
		return nil, nil, fmt.Errorf("decode stored record: %w", err)
	}
	cr := &opaque.ClientRecord{RegistrationRecord: rr, CredentialIdentifier: []byte(locator), ClientIdentity: []byte(locator)}
	m2, out, err := srv.GenerateKE2(m1, cr)
	if err != nil {
		return nil, nil, fmt.Errorf("generate KE2: %w", err)
	}
	return m2.Serialize(), &ServerLogin{srv: srv, clientMAC: out.ClientMAC}, nil
}

// Finish verifies KE3. Any failure is ErrNotAccepted.
func (l *ServerLogin) Finish(ke3 []byte) error {
	m3, err := l.srv.Deserialize.KE3(ke3)
	if err != nil {
		return ErrNotAccepted
	}
	if err := l.srv.LoginFinish(m3, l.clientMAC); err != nil {
		return ErrNotAccepted
	}
	return nil
}

// ClientLogin is the agent's state for one login.
type ClientLogin struct {
	c        *opaque.Client
	locator  string
	password []byte
}

// Start begins a login: it returns KE1. One ClientLogin per attempt.
func Start(bindingCtx []byte, locator string, password []byte) (*ClientLogin, []byte, error) {
	c, err := configuration(bindingCtx).Client()
	if err != nil {
		return nil, nil, fmt.Errorf("opaque client: %w", err)
	}
	ke1, err := c.GenerateKE1(password)
	if err != nil {
		return nil, nil, fmt.Errorf("generate KE1: %w", err)
	}
	return &ClientLogin{c: c, locator: locator, password: password}, ke1.Serialize(), nil
}

// Finish checks KE2 against serverID (the CA fingerprint the agent derived
// from the Challenge) and returns KE3. Any authentication failure is
// ErrNotAccepted; the agent then must send nothing more.
func (l *ClientLogin) Finish(ke2 []byte, serverID []byte, p KSFParams) ([]byte, error) {
	defer l.c.ClearState()
	if err := p.Check(); err != nil {
		return nil, fmt.Errorf("listener asked for unacceptable key stretching: %w", err)
	}
	m2, err := l.c.Deserialize.KE2(ke2)
	if err != nil {
		return nil, ErrNotAccepted
	}
	ke3, _, _, err := l.c.GenerateKE3(m2, []byte(l.locator), serverID, p.clientOptions())
	if err != nil {
		return nil, ErrNotAccepted
	}
	return ke3.Serialize(), nil
}
