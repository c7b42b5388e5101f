package pake

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha512"
	"errors"
	"testing"

	"github.com/bytemare/ecc"
	"github.com/bytemare/opaque/message"

	"github.com/stratumjoin/stratum/internal/wire"
)

func login(t *testing.T, k *ServerKeys, record []byte, locator string, pw, serverCtx, clientCtx, clientServerID []byte) error {
	t.Helper()
	cl, ke1, err := Start(clientCtx, locator, pw)
	if err != nil {
		t.Fatal(err)
	}
	if len(ke1) != KE1Size {
		t.Fatalf("KE1 %d bytes", len(ke1))
	}
	ke2, sl, err := k.Respond(serverCtx, bytes.Repeat([]byte{7}, 32), locator, ke1, record)
	if err != nil {
		t.Fatal(err)
	}
	if len(ke2) != KE2Size {
		t.Fatalf("KE2 %d bytes", len(ke2))
	}
	ke3, _, err := cl.Finish(ke2, clientServerID, LightestKSF)
	if err != nil {
		return err
	}
	if len(ke3) != KE3Size {
		t.Fatalf("KE3 %d bytes", len(ke3))
	}
	if err := sl.Finish(ke3); err != nil {
		t.Fatalf("server rejected a KE3 the client produced: %v", err)
	}
	return nil
}

func TestLogin(t *testing.T) {
	k, err := GenerateServerKeys()
	if err != nil {
		t.Fatal(err)
	}
	k2, err := DecodeServerKeys(k.Encode())
	if err != nil {
		t.Fatal(err)
	}
	fp := bytes.Repeat([]byte{7}, 32)
	otherFP := bytes.Repeat([]byte{8}, 32)
	rec, err := k.Mint("4F", []byte("4F7K2Q9MXZT"), fp, LightestKSF)
	if err != nil {
		t.Fatal(err)
	}
	if len(rec) != RecordSize {
		t.Fatalf("record %d bytes", len(rec))
	}
	ctxA := wire.BindingContext(bytes.Repeat([]byte{1}, 32))
	ctxB := wire.BindingContext(bytes.Repeat([]byte{2}, 32))
	for _, tc := range []struct {
		name         string
		keys         *ServerKeys
		record       []byte
		locator, pw  string
		sctx, cctx   []byte
		clientSrvID  []byte
		wantAccepted bool
	}{
		{"right code", k, rec, "4F", "4F7K2Q9MXZT", ctxA, ctxA, fp, true},
		{"keys reloaded from file", k2, rec, "4F", "4F7K2Q9MXZT", ctxA, ctxA, fp, true},
		{"wrong code", k, rec, "4F", "4F7K2Q9MXZV", ctxA, ctxA, fp, false},
		{"relay: exporters differ", k, rec, "4F", "4F7K2Q9MXZT", ctxA, ctxB, fp, false},
		{"other CA fingerprint", k, rec, "4F", "4F7K2Q9MXZT", ctxA, ctxA, otherFP, false},
		{"other locator", k, rec, "4G", "4F7K2Q9MXZT", ctxA, ctxA, fp, false},
		{"unknown locator, fake record", k, nil, "4F", "4F7K2Q9MXZT", ctxA, ctxA, fp, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := login(t, tc.keys, tc.record, tc.locator, []byte(tc.pw), tc.sctx, tc.cctx, tc.clientSrvID)
			if tc.wantAccepted && err != nil {
				t.Fatalf("login failed: %v", err)
			}
			if !tc.wantAccepted && !errors.Is(err, ErrNotAccepted) {
				t.Fatalf("login: %v, want ErrNotAccepted", err)
			}
		})
	}
}

func TestFakeRecordStable(t *testing.T) {
	k, _ := GenerateServerKeys()
	ctx := wire.BindingContext(make([]byte, 32))
	_, ke1, _ := Start(ctx, "ZZ", []byte("anything"))
	a, _, err := k.Respond(ctx, make([]byte, 32), "ZZ", ke1, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _, _ := k.Respond(ctx, make([]byte, 32), "ZZ", ke1, nil)
	c, _, _ := k.Respond(ctx, make([]byte, 32), "ZY", ke1, nil)
	// the first 32 bytes of KE2 are the OPRF evaluation of the blinded element
	if !bytes.Equal(a[:32], b[:32]) {
		t.Fatal("same blinded element got two different evaluations for one unknown locator")
	}
	if bytes.Equal(a[:32], c[:32]) {
		t.Fatal("two unknown locators share an OPRF key")
	}
	r1, err1 := k.fakeRecord("ZZ")
	r2, err2 := k.fakeRecord("ZZ")
	if err1 != nil || err2 != nil || !bytes.Equal(r1, r2) {
		t.Fatalf("fake record not stable (%v, %v)", err1, err2)
	}
}

// TestFakeRecordIsARecord: the fake record, built with the fixed-base
// multiplication, is byte for byte the record of ecc's generic one (what
// earlier releases answered with), and decodes as a record.
func TestFakeRecordIsARecord(t *testing.T) {
	k, err := GenerateServerKeys()
	if err != nil {
		t.Fatal(err)
	}
	for _, locator := range []string{"ZZ", "4F", "Q9"} {
		got, err := k.fakeRecord(locator)
		if err != nil {
			t.Fatal(err)
		}
		mac := hmac.New(sha512.New, k.fakeSeed)
		mac.Write([]byte("stratum-join fake record\x00"))
		mac.Write([]byte(locator))
		g := ecc.Ristretto255Sha512
		scalar := g.HashToScalar(mac.Sum(nil)[:32], []byte("stratum-join-fake-v1"))
		mk := hmac.New(sha512.New, k.fakeSeed)
		mk.Write([]byte("stratum-join fake masking key\x00"))
		mk.Write([]byte(locator))
		want := (&message.RegistrationRecord{ClientPublicKey: g.Base().Multiply(scalar), MaskingKey: mk.Sum(nil), Envelope: make([]byte, 96)}).Serialize()
		if !bytes.Equal(got, want) {
			t.Fatalf("fake record for %s:\n got %x\nwant %x", locator, got, want)
		}
		srv, err := k.server(nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := srv.Deserialize.RegistrationRecord(got); err != nil {
			t.Fatalf("fake record does not decode: %v", err)
		}
	}
}

// TestDecodeServerKeysChecksTheKeyPair: a key file whose public key is not
// its private key's is refused when it is loaded, not at the first login.
func TestDecodeServerKeysChecksTheKeyPair(t *testing.T) {
	k, err := GenerateServerKeys()
	if err != nil {
		t.Fatal(err)
	}
	other, err := GenerateServerKeys()
	if err != nil {
		t.Fatal(err)
	}
	bad := *k
	m := *k.material
	m.PublicKeyBytes = other.material.PublicKeyBytes
	bad.material = &m
	if _, err := DecodeServerKeys(k.Encode()); err != nil {
		t.Fatalf("a good key file: %v", err)
	}
	if _, err := DecodeServerKeys(bad.Encode()); err == nil {
		t.Fatal("a key file with another key's public half was accepted")
	}
}

func TestKSFBounds(t *testing.T) {
	for _, p := range []KSFParams{{Time: 0, MemoryKiB: 8192, Threads: 1}, {Time: 1, MemoryKiB: 1024, Threads: 1}, {Time: 1, MemoryKiB: 8192, Threads: 0}, {Time: 1, MemoryKiB: 2 << 20, Threads: 1}} {
		if p.Check() == nil {
			t.Errorf("%+v accepted", p)
		}
	}
	if DefaultKSF.Check() != nil || LightestKSF.Check() != nil {
		t.Fatal("defaults rejected")
	}
}

func BenchmarkRespond(b *testing.B) {
	k, _ := GenerateServerKeys()
	fp := make([]byte, 32)
	rec, _ := k.Mint("4F", []byte("4F7K2Q9MXZT"), fp, LightestKSF)
	ctx := wire.BindingContext(make([]byte, 32))
	_, ke1, _ := Start(ctx, "4F", []byte("4F7K2Q9MXZT"))
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := k.Respond(ctx, fp, "4F", ke1, rec); err != nil {
			b.Fatal(err)
		}
	}
}

// FuzzDecodeServerKeys: the opaque.key file never panics the decoder, and
// keys it accepts encode back to the same bytes.
func FuzzDecodeServerKeys(f *testing.F) {
	k, _ := GenerateServerKeys()
	f.Add(k.Encode())
	f.Add([]byte{0, 1, 2})
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := DecodeServerKeys(data)
		if err != nil {
			return
		}
		if !bytes.Equal(got.Encode(), data) {
			t.Fatal("decode-encode round trip differs")
		}
	})
}
