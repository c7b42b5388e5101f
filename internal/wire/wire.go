// Package wire is the Stratum Join protocol between agent and listener:
// message types, their validation, and the framing both sides use. Neither
// agent/ nor listener/ defines wire formats of its own.
//
// A join is one bidirectional QUIC stream on a connection whose ALPN is
// ALPNJoin:
//
//	agent                                   listener
//	Hello{version, locator, KE1}     ->
//	                                        charge the source's budget, then count the attempt (one durable transaction each)
//	                                 <-     Challenge{KE2, caChain, ksf}
//	                                        or, over the source's budget and whatever the locator:
//	                                 <-     Result{status: refused, code: JOIN_RATE_LIMITED, retryAfter}
//	finish OPAQUE, pin the CA,
//	check the QUIC certificate
//	Proof{KE3, CSR, facts, tpm?}     ->
//	                                        verify KE3; with proof.tpm:
//	                                 <-     TPMChallenge{credential, secret, nonce}
//	TPMAnswer{secret, certifyInfo, sig} ->
//	                                        check the attestation (docs/tpm.md);
//	                                        one transaction: prove, check, consume a use
//	                                 <-     Result{status: pending, joinId, pendingFor}   (only with approval; repeats nothing else)
//	                                 <-     Result{status: joined|refused, ...}
//
// A renewal is one stream on a connection whose ALPN is ALPNNode, with
// mutual TLS under the node's current certificate:
//
//	Renew{CSR}                       ->
//	                                 <-     Result{status: joined|refused, ...}
//
// or, to leave the cluster (the node revokes its own certificate):
//
//	Leave{}                          ->
//	                                 <-     Result{status: left|refused, nodeId}
//
// Each frame is a 4-byte big-endian length, then one type byte, then the
// message as canonical CBOR. Frames are at most MaxFrame bytes. Decoding is
// strict: unknown fields, duplicate keys, indefinite lengths, trailing
// bytes and a type other than the one expected are errors.
//
// Version history:
//
//	1  first version.
package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"reflect"

	"github.com/fxamacker/cbor/v2"
)

// Version is the protocol version an agent sends in Hello.
const Version = 1

// ALPN protocol ids.
const (
	ALPNJoin = "stratum-join/1"
	ALPNNode = "stratum-node/1"
)

// MaxFrame bounds a frame's payload (type byte + body).
const MaxFrame = 64 << 10

// Type tags of the frames.
const (
	TypeHello     byte = 1
	TypeChallenge byte = 2
	TypeProof     byte = 3
	TypeResult    byte = 4
	TypeRenew     byte = 5
	// 6 is not used.
	TypeTPMChallenge byte = 7
	TypeTPMAnswer    byte = 8
	TypeLeave        byte = 9
)

// Message is implemented by every frame body.
type Message interface {
	Type() byte
	// Check validates the message after decoding and before encoding.
	Check() error
}

var (
	encMode cbor.EncMode
	decMode cbor.DecMode
)

func init() {
	var err error
	if encMode, err = cbor.CoreDetEncOptions().EncMode(); err != nil {
		panic(err)
	}
	decMode, err = cbor.DecOptions{
		DupMapKey:         cbor.DupMapKeyEnforcedAPF,
		IndefLength:       cbor.IndefLengthForbidden,
		ExtraReturnErrors: cbor.ExtraDecErrorUnknownField,
		MaxNestedLevels:   8,
		MaxArrayElements:  64,
		MaxMapPairs:       32,
		TagsMd:            cbor.TagsForbidden,
	}.DecMode()
	if err != nil {
		panic(err)
	}
}

// ErrFrame marks every framing and decoding error.
var ErrFrame = errors.New("malformed frame")

// Encode returns m as one frame.
func Encode(m Message) ([]byte, error) {
	if err := m.Check(); err != nil {
		return nil, fmt.Errorf("refusing to send invalid %T: %w", m, err)
	}
	body, err := encMode.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("encode %T: %w", m, err)
	}
	if 1+len(body) > MaxFrame {
		return nil, fmt.Errorf("encode %T: %d bytes exceeds the %d byte frame limit", m, 1+len(body), MaxFrame)
	}
	frame := make([]byte, 4, 5+len(body))
	binary.BigEndian.PutUint32(frame, uint32(1+len(body)))
	frame = append(frame, m.Type())
	return append(frame, body...), nil
}

// Write sends m as one frame.
func Write(w io.Writer, m Message) error {
	frame, err := Encode(m)
	if err != nil {
		return err
	}
	if _, err := w.Write(frame); err != nil {
		return fmt.Errorf("send %T: %w", m, err)
	}
	return nil
}

// ReadFrame reads one frame and returns its type and body.
func ReadFrame(r io.Reader) (byte, []byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n == 0 || n > MaxFrame {
		return 0, nil, fmt.Errorf("%w: length %d outside 1..%d", ErrFrame, n, MaxFrame)
	}
	buf := make([]byte, n)
	if _, err := io.ReadFull(r, buf); err != nil {
		// the connection ended mid-frame: a transport failure, not a
		// malformed message, so a caller may retry
		return 0, nil, fmt.Errorf("frame cut short: %w", err)
	}
	return buf[0], buf[1:], nil
}

// Decode parses body into m strictly and validates it.
func Decode(typ byte, body []byte, m Message) error {
	if typ != m.Type() {
		return fmt.Errorf("%w: got type %d, want %s", ErrFrame, typ, reflect.TypeOf(m).Elem().Name())
	}
	if err := decMode.Unmarshal(body, m); err != nil {
		return fmt.Errorf("%w: %s: %w", ErrFrame, reflect.TypeOf(m).Elem().Name(), err)
	}
	if err := m.Check(); err != nil {
		return fmt.Errorf("%w: %s: %w", ErrFrame, reflect.TypeOf(m).Elem().Name(), err)
	}
	return nil
}

// Read receives one frame that must be of m's type.
func Read(r io.Reader, m Message) error {
	typ, body, err := ReadFrame(r)
	if err != nil {
		return err
	}
	return Decode(typ, body, m)
}
