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
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/sha512"
	"errors"
	"fmt"

	"github.com/bytemare/ecc"
	"github.com/bytemare/ksf"
	"github.com/bytemare/opaque"
	"github.com/gtank/ristretto255"

	"github.com/stratumjoin/stratum/internal/wire"
)

// ContextLabel starts every AKE context.
const ContextLabel = wire.ContextLabel

// Sizes of the messages on the wire with the suite we use
// (ristretto255, SHA-512). The KE sizes are the protocol's (internal/wire);
// the tests check that OPAQUE produces them.
const (
	KE1Size    = wire.KE1Size
	KE2Size    = wire.KE2Size
	KE3Size    = wire.KE3Size
	RecordSize = 192
)

// KSFParams are the key stretching parameters a Challenge carries; the type
// and its bounds are the protocol's (internal/wire).
type KSFParams = wire.KSFParams

// The settings, as internal/wire names them.
var (
	NoKSF       = wire.NoKSF
	CodeKSF     = wire.CodeKSF
	DefaultKSF  = wire.DefaultKSF
	LightestKSF = wire.LightestKSF
)

func clientOptions(p KSFParams) *opaque.ClientOptions {
	if p.None() {
		return &opaque.ClientOptions{}
	}
	return &opaque.ClientOptions{KSFParameters: []uint64{uint64(p.Time), uint64(p.MemoryKiB), uint64(p.Threads)}}
}

// ErrNotAccepted is the only thing either side learns from a failed login:
// a wrong secret, a wrong CA, a relay and a fake listener look the same.
var ErrNotAccepted = errors.New("code not accepted, or the listener is not authentic")

func configuration(ctx []byte) *opaque.Configuration {
	return configurationFor(ctx, DefaultKSF)
}

// configurationFor is the configuration of a client that stretches with
// p: Argon2id, or the identity KSF (0) for NoKSF.
func configurationFor(ctx []byte, p KSFParams) *opaque.Configuration {
	conf := opaque.DefaultConfiguration()
	conf.KSF = ksf.Argon2id
	if p.None() {
		conf.KSF = 0
	}
	conf.Context = ctx
	return conf
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
	// checked once here: server() then skips SetKeyMaterial's check, a
	// scalar multiplication per login that GenerateKE2 repeats anyway
	srv, err := configuration(nil).Server()
	if err != nil {
		return nil, fmt.Errorf("opaque server: %w", err)
	}
	if err := srv.SetKeyMaterial(m); err != nil {
		return nil, fmt.Errorf("opaque key material: %w", err)
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
	// valid since GenerateServerKeys or DecodeServerKeys
	srv.ServerKeyMaterial = &m
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
	c, err := configurationFor(nil, p).Client()
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
	rec, _, err := c.RegistrationFinalize(resp, []byte(locator), serverID, clientOptions(p))
	if err != nil {
		return nil, fmt.Errorf("registration finalize: %w", err)
	}
	return rec.Serialize(), nil
}

// fakeRecord is stable per locator, so probing an unknown locator twice
// with the same blinded element gets the same evaluation, exactly as a real
// record does.
func (k *ServerKeys) fakeRecord(locator string) ([]byte, error) {
	mac := hmac.New(sha512.New, k.fakeSeed)
	mac.Write([]byte("stratum-join fake record\x00"))
	mac.Write([]byte(locator))
	sum := mac.Sum(nil)
	scalar := ecc.Ristretto255Sha512.HashToScalar(sum[:32], []byte("stratum-join-fake-v1"))
	// the public key by the fixed-base multiplication (its precomputed
	// table makes it about three times faster than ecc's generic one)
	s, err := ristretto255.NewScalar().SetCanonicalBytes(scalar.Encode())
	if err != nil {
		return nil, fmt.Errorf("fake record scalar: %w", err)
	}
	mk := hmac.New(sha512.New, k.fakeSeed)
	mk.Write([]byte("stratum-join fake masking key\x00"))
	mk.Write([]byte(locator))
	// a record serialises as public key, masking key, envelope
	rec := append(make([]byte, 0, 32+64+96), ristretto255.NewIdentityElement().ScalarBaseMult(s).Bytes()...)
	rec = mk.Sum(rec)
	return append(rec, make([]byte, 96)...), nil
}

// ServerLogin is the listener's state for one login between KE2 and KE3.
type ServerLogin struct {
	srv       *opaque.Server
	clientMAC []byte
	session   []byte
	verified  bool
}

// Respond answers KE1 for locator with the record minted under serverID.
// record nil means the locator is unknown: a fake record answers,
// indistinguishable before KE3.
func (k *ServerKeys) Respond(bindingCtx, serverID []byte, locator string, ke1 []byte, record []byte) (ke2 []byte, login *ServerLogin, err error) {
	return k.RespondKE1(bindingCtx, serverID, locator, ParseKE1(ke1), record)
}

// RespondKE1 is Respond for a KE1 that ParseKE1 decoded.
func (k *ServerKeys) RespondKE1(bindingCtx, serverID []byte, locator string, ke1 *KE1, record []byte) (ke2 []byte, login *ServerLogin, err error) {
	if ke1.err != nil {
		return nil, nil, ke1.err
	}
	m1 := ke1.msg
	srv, err := k.server(bindingCtx, serverID)
	if err != nil {
		return nil, nil, err
	}
	// Both paths do the same work, so KE2's timing does not tell an unknown
	// locator from a known one: derive the fake record (a scalar
	// multiplication) and decode a serialised record (a point
	// decompression) every time, whichever of the two answers.
	fake, err := k.fakeRecord(locator)
	if err != nil {
		return nil, nil, err
	}
	if record == nil {
		record = fake
	}
	rr, err := srv.Deserialize.RegistrationRecord(record)
	if err != nil {
		return nil, nil, fmt.Errorf("decode stored record: %w", err)
	}
	cr := &opaque.ClientRecord{RegistrationRecord: rr, CredentialIdentifier: []byte(locator), ClientIdentity: []byte(locator)}
	m2, out, err := srv.GenerateKE2(m1, cr)
	if err != nil {
		return nil, nil, fmt.Errorf("generate KE2: %w", err)
	}
	return m2.Serialize(), &ServerLogin{srv: srv, clientMAC: out.ClientMAC, session: out.SessionSecret}, nil
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
	l.verified = true
	return nil
}

// SAS is the short authentication string of this login for joinID; only
// after Finish verified KE3 (the session key is not to be used before).
func (l *ServerLogin) SAS(joinID string) (string, error) {
	if !l.verified {
		return "", errors.New("sas before the login was verified")
	}
	return SAS(l.session, joinID), nil
}

// ClientLogin is the agent's state for one login. The OPRF blind and the
// AKE key share are chosen here, so that the KE3 can be computed by a
// client configured with the KSF the Challenge names (KE1 does not depend
// on it).
type ClientLogin struct {
	bindingCtx []byte
	locator    string
	password   []byte
	blind      *ecc.Scalar
	esk        *ecc.Scalar
	ke1        []byte
}

// Start begins a login: it returns KE1. One ClientLogin per attempt.
func Start(bindingCtx []byte, locator string, password []byte) (*ClientLogin, []byte, error) {
	return start(bindingCtx, locator, password, ecc.Ristretto255Sha512.NewScalar().Random())
}

// start begins a login with the OPRF blind given; the AKE key share is
// always fresh.
func start(bindingCtx []byte, locator string, password []byte, blind *ecc.Scalar) (*ClientLogin, []byte, error) {
	c, err := configuration(bindingCtx).Client()
	if err != nil {
		return nil, nil, fmt.Errorf("opaque client: %w", err)
	}
	defer c.ClearState()
	esk := ecc.Ristretto255Sha512.NewScalar().Random()
	ke1, err := c.GenerateKE1(password, &opaque.ClientOptions{OPRFBlind: blind.Copy(), AKE: &opaque.AKEOptions{SecretKeyShare: esk.Copy()}})
	if err != nil {
		return nil, nil, fmt.Errorf("generate KE1: %w", err)
	}
	b := ke1.Serialize()
	return &ClientLogin{bindingCtx: bindingCtx, locator: locator, password: password, blind: blind, esk: esk, ke1: b}, b, nil
}

// Finish checks KE2 against serverID (the CA fingerprint the agent derived
// from the Challenge) and returns KE3 and the session key (for the SAS).
// Any authentication failure is ErrNotAccepted; the agent then must send
// nothing more.
func (l *ClientLogin) Finish(ke2 []byte, serverID []byte, p KSFParams) (ke3, session []byte, err error) {
	defer func() { l.blind.Zero(); l.esk.Zero() }()
	if err := p.Check(); err != nil {
		return nil, nil, fmt.Errorf("listener asked for unacceptable key stretching: %w", err)
	}
	c, err := configurationFor(l.bindingCtx, p).Client()
	if err != nil {
		return nil, nil, fmt.Errorf("opaque client: %w", err)
	}
	defer c.ClearState()
	m2, err := c.Deserialize.KE2(ke2)
	if err != nil {
		return nil, nil, ErrNotAccepted
	}
	opts := clientOptions(p)
	opts.OPRFBlind, opts.ResumePassword, opts.ResumeKE1 = l.blind, l.password, l.ke1
	opts.AKE = &opaque.AKEOptions{SecretKeyShare: l.esk}
	m3, sessionKey, _, err := c.GenerateKE3(m2, []byte(l.locator), serverID, opts)
	if err != nil {
		return nil, nil, ErrNotAccepted
	}
	return m3.Serialize(), sessionKey, nil
}

// SASLabel starts the HKDF info of a short authentication string.
const SASLabel = "stratum-join/1 sas"

// SAS derives the short authentication string of a join from the PAKE
// session key: 6 decimal digits of HKDF-SHA-256(session, info = SASLabel
// || 0 || joinID). Both ends compute it; only the two ends of this PAKE
// session hold the key, so a machine racing the same code, or a relay,
// gets other digits (docs/secrets.md gives the property and its limits).
func SAS(session []byte, joinID string) string {
	out, err := hkdf.Key(sha256.New, session, nil, SASLabel+"\x00"+joinID, 4)
	if err != nil { // only for an output length HKDF cannot give
		panic(err)
	}
	n := uint32(out[0])<<24 | uint32(out[1])<<16 | uint32(out[2])<<8 | uint32(out[3])
	return fmt.Sprintf("%06d", n%1000000)
}
