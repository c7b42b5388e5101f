package listener

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stratumjoin/stratum/internal/keyseal"
)

// The KEK comes from the systemd credential when the unit passes one, and
// from the key directory otherwise.
func TestKEKFromCredential(t *testing.T) {
	keys, creds := t.TempDir(), t.TempDir()
	own, _ := keyseal.NewKEK()
	cred, _ := keyseal.NewKEK()
	if err := os.WriteFile(filepath.Join(keys, KEKFile), own.Encode(), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(creds, KEKFile), cred.Encode(), 0o400); err != nil {
		t.Fatal(err)
	}
	t.Setenv("CREDENTIALS_DIRECTORY", creds)
	if k, _, ok, err := loadKEK(keys); err != nil || !ok || k != cred {
		t.Fatalf("with the credential: ok %v err %v, credential's key %v", ok, err, k == cred)
	}
	t.Setenv("CREDENTIALS_DIRECTORY", t.TempDir()) // a unit without it
	if k, _, ok, err := loadKEK(keys); err != nil || !ok || k != own {
		t.Fatalf("without the credential: ok %v err %v", ok, err)
	}
	if _, _, ok, err := loadKEK(t.TempDir()); err != nil || ok {
		t.Fatalf("no KEK at all: ok %v err %v", ok, err)
	}
}

// FuzzOpenIdentity decodes cluster identity records as read from the
// store, which anyone who can write to etcd controls.
func FuzzOpenIdentity(f *testing.F) {
	k := keyseal.KEK{7}
	rec, err := sealIdentity(k, sharedPublic{TrustDomain: "a.example", Cross: map[string]string{"cross-00.crt": "x"}}, sharedSecret{CAKey: []byte("k"), OPAQUE: []byte("o")})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(rec)
	f.Add([]byte(`{"v":1,"kekId":"00","public":"e30="}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = publicIdentity(b)
		if pub, _, err := openIdentity(k, b); err == nil && pub.TrustDomain != "a.example" {
			t.Fatalf("a record not sealed here opened: %+v", pub)
		}
	})
}
