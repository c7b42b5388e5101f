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

// TestParseKE1: a KE1 decoded once names the guess GuessOf names and is
// answered as its bytes are; a malformed one names none and is refused.
func TestParseKE1(t *testing.T) {
	k, err := GenerateServerKeys()
	if err != nil {
		t.Fatal(err)
	}
	fp := make([]byte, 32)
	rec, err := k.Mint("AB", []byte("AB000000000"), fp, LightestKSF)
	if err != nil {
		t.Fatal(err)
	}
	ctx := bytes.Repeat([]byte{1}, 32)
	cl, raw, err := StartSeeded(ctx, "AB", []byte("AB000000000"), bytes.Repeat([]byte{7}, 32))
	if err != nil {
		t.Fatal(err)
	}
	ke1 := ParseKE1(raw)
	if g, _ := GuessOf(raw); g == "" || ke1.Guess() != g {
		t.Fatalf("guess %q, GuessOf %q", ke1.Guess(), g)
	}
	ke2, login, err := k.RespondKE1(ctx, fp, "AB", ke1, rec)
	if err != nil {
		t.Fatal(err)
	}
	ke3, _, err := cl.Finish(ke2, fp, LightestKSF)
	if err != nil {
		t.Fatalf("client finish: %v", err)
	}
	if err := login.Finish(ke3); err != nil {
		t.Fatalf("server finish: %v", err)
	}
	bad := ParseKE1([]byte("not a KE1"))
	if bad.Guess() != "" {
		t.Fatal("a malformed KE1 names a guess")
	}
	if _, _, err := k.RespondKE1(ctx, fp, "AB", bad, rec); err == nil {
		t.Fatal("a malformed KE1 was answered")
	}
}
