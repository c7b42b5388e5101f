package pki_test

import (
	"testing"

	"github.com/stratumjoin/stratum/pki"
	"github.com/stratumjoin/stratum/pki/pkitest"
)

// FuzzParsePrivateKeyPEM: imported CA keys and node.key files never panic
// the parser, and a key it accepts round-trips.
func FuzzParsePrivateKeyPEM(f *testing.F) {
	key := pkitest.NewKey(f)
	good, err := pki.MarshalPrivateKeyPEM(key)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add([]byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"))
	f.Add([]byte("-----BEGIN EC PRIVATE KEY-----\n-----END EC PRIVATE KEY-----\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		k, err := pki.ParsePrivateKeyPEM(data)
		if err != nil {
			return
		}
		again, err := pki.MarshalPrivateKeyPEM(k)
		if err != nil {
			t.Fatalf("accepted a key it cannot write back: %v", err)
		}
		if _, err := pki.ParsePrivateKeyPEM(again); err != nil {
			t.Fatalf("round trip: %v", err)
		}
	})
}
