package keyseal

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func mustKEK(t testing.TB) KEK {
	t.Helper()
	k, err := NewKEK()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestSealOpenRoundTrip(t *testing.T) {
	k := mustKEK(t)
	secret := []byte("the oprf seed and the ca key")
	rec, err := Seal(k, []byte(`{"ca":"public"}`), secret)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(rec, secret) {
		t.Fatal("the secret is in the record in clear")
	}
	pub, got, err := Open(k, rec)
	if err != nil || !bytes.Equal(got, secret) || string(pub) != `{"ca":"public"}` {
		t.Fatalf("open: %q %q %v", pub, got, err)
	}
	if p, id, err := Public(rec); err != nil || id != k.ID() || string(p) != `{"ca":"public"}` {
		t.Fatalf("public: %q %s %v", p, id, err)
	}
}

func TestOpenNamesWrongKEKAndTampering(t *testing.T) {
	k := mustKEK(t)
	rec, err := Seal(k, []byte("pub"), []byte("secret"))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := Open(mustKEK(t), rec); !errors.Is(err, ErrWrongKEK) {
		t.Fatalf("another kek: %v", err)
	}
	// Changing the public part (associated data) must break the seal.
	var r record
	if err := json.Unmarshal(rec, &r); err != nil {
		t.Fatal(err)
	}
	r.Public = []byte("puc")
	bad, _ := json.Marshal(r)
	if _, _, err := Open(k, bad); !errors.Is(err, ErrTampered) {
		t.Fatalf("changed public part: %v", err)
	}
	// A KEK id forged to match does not help a wrong key.
	other := mustKEK(t)
	r.Public, r.KEKID = []byte("pub"), other.ID()
	forged, _ := json.Marshal(r)
	if _, _, err := Open(other, forged); !errors.Is(err, ErrTampered) {
		t.Fatalf("forged kek id: %v", err)
	}
}

func TestKEKFile(t *testing.T) {
	k := mustKEK(t)
	path := filepath.Join(t.TempDir(), "cluster.kek")
	if err := os.WriteFile(path, k.Encode(), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := LoadKEK(path)
	if err != nil || got != k {
		t.Fatalf("load: %v", err)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadKEK(path); err == nil {
		t.Fatal("a world-readable kek file loads")
	}
	if raw, err := ParseKEK(k[:]); err != nil || raw != k {
		t.Fatalf("raw 32 bytes: %v", err)
	}
	if _, err := ParseKEK([]byte("short")); err == nil {
		t.Fatal("a short kek parses")
	}
}

// FuzzOpen feeds arbitrary records (as read from a store anyone may write
// to) to the decoder: it must never panic, and only the real record opens.
func FuzzOpen(f *testing.F) {
	k := KEK{1, 2, 3}
	rec, err := Seal(k, []byte("pub"), []byte("secret"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(rec)
	f.Add([]byte(`{"v":1}`))
	f.Add([]byte(`{"v":1,"kekId":"0011223344556677","nonce":"AAAAAAAAAAAAAAAA","sealed":"AAAAAAAAAAAAAAAAAAAAAA=="}`))
	f.Add([]byte("not json"))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _, _ = Public(b)
		if _, s, err := Open(k, b); err == nil && !bytes.Equal(s, []byte("secret")) {
			t.Fatalf("a forged record opened: %q", s)
		}
	})
}
