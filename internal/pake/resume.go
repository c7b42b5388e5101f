package pake

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/bytemare/ecc"
	"github.com/bytemare/opaque/message"
)

// blindDST separates the blinds derived from an attempt seed from every
// other use of hash-to-scalar.
const blindDST = "stratum-join attempt blind v1"

// StartSeeded is Start with the OPRF blind derived from seed, a secret the
// agent keeps on disk for one attempt: an agent that starts again after a
// crash, with the same seed and code, sends the same blinded element, so
// the listener can resume the attempt it counted instead of counting
// another. Repeating a blinded element repeats the same password guess
// and teaches a guesser nothing new; the AKE nonce and key share stay
// fresh for every connection.
func StartSeeded(bindingCtx []byte, locator string, password, seed []byte) (*ClientLogin, []byte, error) {
	if len(seed) < 32 {
		return nil, nil, errors.New("attempt seed shorter than 32 bytes")
	}
	conf := configuration(bindingCtx)
	blind := ecc.Group(conf.OPRF).HashToScalar(seed, []byte(blindDST))
	return start(bindingCtx, locator, password, blind)
}

// GuessOf names the password guess a KE1 carries: hex SHA-256 of its
// blinded element. Two KE1s with the same guess ask the same question.
func GuessOf(ke1 []byte) (string, error) {
	k := ParseKE1(ke1)
	if k.err != nil {
		return "", k.err
	}
	return k.Guess(), nil
}

// KE1 is a decoded KE1, so that naming its guess and answering it decode
// it (a point decompression) once.
type KE1 struct {
	msg *message.KE1
	err error
}

// ParseKE1 decodes ke1; a malformed one is only refused by Guess (which
// names no guess) and by RespondKE1.
func ParseKE1(ke1 []byte) *KE1 {
	d, err := configuration(nil).Deserializer()
	if err != nil {
		return &KE1{err: err}
	}
	m, err := d.KE1(ke1)
	if err != nil {
		return &KE1{err: fmt.Errorf("decode KE1: %w", err)}
	}
	return &KE1{msg: m}
}

// Guess is GuessOf the KE1, "" for a malformed one.
func (k *KE1) Guess() string {
	if k.err != nil {
		return ""
	}
	h := sha256.Sum256(k.msg.BlindedMessage.Encode())
	return hex.EncodeToString(h[:])
}
