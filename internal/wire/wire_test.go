package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"reflect"
	"testing"

	"github.com/fxamacker/cbor/v2"
)

func samples() []Message {
	cert := bytes.Repeat([]byte{0x30}, 300)
	return []Message{
		&Hello{Version: Version, Locator: "4F", KE1: make([]byte, KE1Size)},
		&Challenge{KE2: make([]byte, KE2Size), CAChain: [][]byte{cert}, KSF: LightestKSF},
		&Proof{KE3: make([]byte, KE3Size), CSR: []byte{1, 2, 3}, Facts: Facts{ProductUUID: "U", MACs: []string{"aa:bb:cc:dd:ee:ff"}}},
		&Proof{KE3: make([]byte, KE3Size), CSR: []byte{1}, TPM: &TPMClaim{EKPublic: []byte{1}, EKCert: cert, AKPublic: []byte{2}, KeyPublic: []byte{3}}},
		&TPMChallenge{Credential: []byte{1}, Secret: []byte{2}, Nonce: make([]byte, 32)},
		&TPMAnswer{Secret: []byte{1}, CertifyInfo: []byte{2}, Signature: []byte{3}},
		&Renew{CSR: []byte{9}},
		&Leave{},
		&Result{Status: StatusLeft, NodeID: "node-x"},
		&Result{Status: StatusJoined, NodeID: "node-x", Role: "node", Trust: "platform", RenewAfter: 1, CertChain: [][]byte{cert}, CABundle: [][]byte{cert}, Host: &Host{Name: "h", NetworkID: "n"}},
		&Result{Status: StatusPending, JoinID: "join-1"},
		&Result{Status: StatusRefused, Code: CodeStale, Message: "stale"},
		&Hello{Version: Version, Locator: "4F", KE1: make([]byte, KE1Size), Attempt: bytes.Repeat([]byte{4}, AttemptSize)},
		&Proof{KE3: make([]byte, KE3Size), CSR: []byte{1}, Refunds: [][]byte{bytes.Repeat([]byte{5}, AttemptSize)}},
		&Result{Status: StatusRefused, Code: CodeUnavailable, Message: "the listener cannot reach its store", RetryAfter: 5},
		&Result{Status: StatusRefused, Code: CodeRateLimited, Message: "later", RetryAfter: 30},
		&Result{Status: StatusPending, JoinID: "join-2", PendingFor: 86400},
	}
}

func newOf(m Message) Message { return reflect.New(reflect.TypeOf(m).Elem()).Interface().(Message) }

func TestRoundTrip(t *testing.T) {
	for _, m := range samples() {
		var buf bytes.Buffer
		if err := Write(&buf, m); err != nil {
			t.Fatal(err)
		}
		got := newOf(m)
		if err := Read(&buf, got); err != nil {
			t.Fatalf("%T: %v", m, err)
		}
		if !reflect.DeepEqual(got, m) {
			t.Fatalf("round trip %#v != %#v", got, m)
		}
		if buf.Len() != 0 {
			t.Fatal("bytes left over")
		}
	}
}

func frame(typ byte, body []byte) []byte {
	f := make([]byte, 4, 5+len(body))
	binary.BigEndian.PutUint32(f, uint32(1+len(body)))
	return append(append(f, typ), body...)
}

func TestStrictDecoding(t *testing.T) {
	good, _ := cbor.Marshal(map[int]any{1: 1, 2: "4F", 3: make([]byte, KE1Size)})
	unknown, _ := cbor.Marshal(map[int]any{1: 1, 2: "4F", 3: make([]byte, KE1Size), 9: 1})
	wrongLen, _ := cbor.Marshal(map[int]any{1: 1, 2: "4F", 3: make([]byte, 10)})
	badLoc, _ := cbor.Marshal(map[int]any{1: 1, 2: "4F/../x", 3: make([]byte, KE1Size)})
	dup := append([]byte{0xa4}, good[1:]...)
	dup = append(dup, 0x01, 0x01) // key 1 again
	huge := make([]byte, 4)
	binary.BigEndian.PutUint32(huge, MaxFrame+1)
	for _, tc := range []struct {
		name string
		in   []byte
	}{
		{"unknown field", frame(TypeHello, unknown)},
		{"trailing bytes", frame(TypeHello, append(append([]byte(nil), good...), 0x00))},
		{"duplicate key", frame(TypeHello, dup)},
		{"wrong type", frame(TypeProof, good)},
		{"oversized length", append(huge, make([]byte, 16)...)},
		{"zero length", []byte{0, 0, 0, 0}},
		{"truncated", frame(TypeHello, good)[:20]},
		{"KE1 wrong size", frame(TypeHello, wrongLen)},
		{"bad locator", frame(TypeHello, badLoc)},
		{"indefinite length", frame(TypeHello, []byte{0xbf, 0x01, 0x01, 0xff})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h Hello
			err := Read(bytes.NewReader(tc.in), &h)
			if err == nil {
				t.Fatal("accepted")
			}
			if tc.name != "truncated" && !errors.Is(err, ErrFrame) {
				t.Fatalf("error %v is not ErrFrame", err)
			}
		})
	}
	var h Hello
	if err := Read(bytes.NewReader(frame(TypeHello, good)), &h); err != nil {
		t.Fatalf("good frame refused: %v", err)
	}
}

func TestEncodeRefusesInvalid(t *testing.T) {
	if _, err := Encode(&Result{Status: StatusJoined}); err == nil {
		t.Fatal("invalid result encoded")
	}
	big := &Challenge{KE2: make([]byte, KE2Size), CAChain: [][]byte{make([]byte, 8<<10), make([]byte, 8<<10), make([]byte, 8<<10), make([]byte, 8<<10), make([]byte, 8<<10), make([]byte, 8<<10), make([]byte, 8<<10), make([]byte, 8<<10)}, KSF: LightestKSF}
	if _, err := Encode(big); err == nil {
		t.Fatal("frame over 64 KiB encoded")
	}
}

// fuzzDecode feeds arbitrary bytes to the decoder of every message type and
// checks that whatever decodes re-encodes to an equal message.
func fuzzDecode(t *testing.T, data []byte) {
	for _, m := range samples() {
		got := newOf(m)
		if err := Read(bytes.NewReader(data), got); err != nil {
			continue
		}
		enc, err := Encode(got)
		if err != nil {
			t.Fatalf("decoded %T does not re-encode: %v", got, err)
		}
		again := newOf(m)
		if err := Read(bytes.NewReader(enc), again); err != nil || !reflect.DeepEqual(normalize(again), normalize(got)) {
			t.Fatalf("re-decode of %T: %v", got, err)
		}
	}
	_, _, _ = ReadFrame(io.LimitReader(bytes.NewReader(data), int64(len(data))))
}

// normalize maps empty slices to nil: CBOR cannot tell them apart.
func normalize(m Message) Message {
	enc, _ := encMode.Marshal(m)
	out := newOf(m)
	_ = decMode.Unmarshal(enc, out)
	return out
}

func FuzzDecode(f *testing.F) {
	for _, m := range samples() {
		b, err := Encode(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0, 0, 0, 1, 1})
	f.Fuzz(fuzzDecode)
}
