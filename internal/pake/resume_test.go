package pake

import (
	"bytes"
	"testing"
)

// TestSeededStartRepeatsTheGuess: one seed and password give the same
// blinded element on every connection (and fresh AKE values), another
// seed or password another one.
func TestSeededStartRepeatsTheGuess(t *testing.T) {
	seed := bytes.Repeat([]byte{7}, 32)
	guess := func(ctx, pw, seed []byte) (string, []byte) {
		_, ke1, err := StartSeeded(ctx, "AB", pw, seed)
		if err != nil {
			t.Fatal(err)
		}
		g, err := GuessOf(ke1)
		if err != nil {
			t.Fatal(err)
		}
		return g, ke1
	}
	g1, k1 := guess([]byte("conn 1"), []byte("pw"), seed)
	g2, k2 := guess([]byte("conn 2"), []byte("pw"), seed)
	if g1 != g2 {
		t.Fatal("the same seed and password gave two guesses")
	}
	if bytes.Equal(k1, k2) {
		t.Fatal("two KE1s are identical: the AKE nonce and key share must be fresh")
	}
	if g3, _ := guess([]byte("conn 1"), []byte("pw"), bytes.Repeat([]byte{8}, 32)); g3 == g1 {
		t.Fatal("another seed gave the same guess")
	}
	if g4, _ := guess([]byte("conn 1"), []byte("other"), seed); g4 == g1 {
		t.Fatal("another password gave the same guess")
	}
}
