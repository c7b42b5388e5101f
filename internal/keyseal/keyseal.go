// Package keyseal seals the cluster's shared secrets (the CA key, the OPAQUE
// server key and OPRF seed) into one record that can rest in a store that
// other people can read, such as an etcd cluster and its backups.
//
// A record is AES-256-GCM under a 256-bit key-encryption key (KEK) that each
// listener holds outside the store: a 0600 file or a systemd credential. The
// public part of the record (certificates, fingerprints, settings) is in
// clear and bound to the ciphertext as associated data, so it can be read
// without the KEK but not changed without the seal failing. Without the KEK
// a stolen record gives no OPRF seed, so no join code can be tested offline.
// docs/cluster.md describes the cluster identity built on it.
package keyseal

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
)

// KEKSize is the size of a key-encryption key in bytes.
const KEKSize = 32

// KEK is a key-encryption key.
type KEK [KEKSize]byte

// version is the record format; the associated data starts with it.
const version = 1

var (
	// ErrWrongKEK means the record was sealed under another KEK.
	ErrWrongKEK = errors.New("the key-encryption key is not the one this record was sealed with")
	// ErrTampered means the record does not open under its own KEK: it was
	// changed or damaged after sealing.
	ErrTampered = errors.New("sealed record does not authenticate: it was changed or damaged")
)

// NewKEK draws a KEK from crypto/rand.
func NewKEK() (KEK, error) {
	var k KEK
	if _, err := rand.Read(k[:]); err != nil {
		return k, fmt.Errorf("draw key-encryption key: %w", err)
	}
	return k, nil
}

// ID names a KEK without revealing it: the first 8 bytes of an HMAC of a
// fixed label, in hex. Records carry it so that a wrong KEK is told apart
// from a damaged record.
func (k KEK) ID() string {
	m := hmac.New(sha256.New, k[:])
	m.Write([]byte("stratum kek id v1"))
	return hex.EncodeToString(m.Sum(nil)[:8])
}

// Encode is the file form of a KEK: 64 hex digits and a newline.
func (k KEK) Encode() []byte { return []byte(hex.EncodeToString(k[:]) + "\n") }

// ParseKEK reads a KEK in its file form (64 hex digits, surrounding space
// ignored) or as 32 raw bytes.
func ParseKEK(b []byte) (KEK, error) {
	var k KEK
	if len(b) == KEKSize {
		copy(k[:], b)
		return k, nil
	}
	s := strings.TrimSpace(string(b))
	if len(s) != 2*KEKSize {
		return k, fmt.Errorf("key-encryption key: want %d hex digits or %d raw bytes, got %d bytes", 2*KEKSize, KEKSize, len(b))
	}
	if _, err := hex.Decode(k[:], []byte(s)); err != nil {
		return k, errors.New("key-encryption key: not hex")
	}
	return k, nil
}

// LoadKEK reads a KEK file, refusing one that group or others can read.
func LoadKEK(path string) (KEK, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return KEK{}, fmt.Errorf("key-encryption key: %w", err)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return KEK{}, fmt.Errorf("key-encryption key %s has mode %#o; it must be 0600", path, perm)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return KEK{}, fmt.Errorf("key-encryption key: %w", err)
	}
	k, err := ParseKEK(b)
	if err != nil {
		return KEK{}, fmt.Errorf("%s: %w", path, err)
	}
	return k, nil
}

// record is the stored form. Public is kept as the exact bytes that were
// authenticated.
type record struct {
	V      int    `json:"v"`
	KEKID  string `json:"kekId"`
	Public []byte `json:"public"`
	Nonce  []byte `json:"nonce"`
	Sealed []byte `json:"sealed"`
}

func aad(kekID string, public []byte) []byte {
	return fmt.Appendf(nil, "stratum sealed record v%d\x00%s\x00%s", version, kekID, public)
}

func newAEAD(k KEK) cipher.AEAD {
	block, err := aes.NewCipher(k[:])
	if err != nil {
		panic(err) // a 32-byte key is always valid
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		panic(err)
	}
	return aead
}

// Seal seals secret under k, binding public (stored in clear) to it.
func Seal(k KEK, public, secret []byte) ([]byte, error) {
	aead := newAEAD(k)
	nonce := make([]byte, aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, fmt.Errorf("seal: draw nonce: %w", err)
	}
	id := k.ID()
	r := record{V: version, KEKID: id, Public: public, Nonce: nonce, Sealed: aead.Seal(nil, nonce, secret, aad(id, public))}
	return json.Marshal(r)
}

func decode(b []byte) (record, error) {
	var r record
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("sealed record: %w", err)
	}
	if r.V != version {
		return r, fmt.Errorf("sealed record: version %d, want %d", r.V, version)
	}
	if len(r.Nonce) != 12 || len(r.Sealed) < 16 || len(r.KEKID) != 16 {
		return r, errors.New("sealed record: malformed")
	}
	return r, nil
}

// Public returns the record's public part and the id of the KEK it was
// sealed with, without opening it. The public part is not authenticated
// until Open succeeds.
func Public(b []byte) (public []byte, kekID string, err error) {
	r, err := decode(b)
	if err != nil {
		return nil, "", err
	}
	return r.Public, r.KEKID, nil
}

// Open checks and opens a record sealed under k. It returns ErrWrongKEK
// when the record names another KEK and ErrTampered when it does not
// authenticate.
func Open(k KEK, b []byte) (public, secret []byte, err error) {
	r, err := decode(b)
	if err != nil {
		return nil, nil, err
	}
	if id := k.ID(); id != r.KEKID {
		return nil, nil, fmt.Errorf("%w (key id %s, record sealed under %s)", ErrWrongKEK, id, r.KEKID)
	}
	secret, err = newAEAD(k).Open(nil, r.Nonce, r.Sealed, aad(r.KEKID, r.Public))
	if err != nil {
		return nil, nil, ErrTampered
	}
	return r.Public, secret, nil
}
