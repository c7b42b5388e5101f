package pake

import (
	"bytes"
	"regexp"
	"testing"

	"github.com/stratumjoin/stratum/internal/wire"
)

// session runs one login and returns both ends' SAS for joinID.
func session(t *testing.T, k *ServerKeys, rec []byte, p KSFParams, pw []byte, joinID string) (client, server string, err error) {
	t.Helper()
	fp := bytes.Repeat([]byte{7}, 32)
	ctx := wire.BindingContext(bytes.Repeat([]byte{1}, 32))
	cl, ke1, err := Start(ctx, "4F", pw)
	if err != nil {
		t.Fatal(err)
	}
	ke2, sl, err := k.Respond(ctx, fp, "4F", ke1, rec)
	if err != nil {
		t.Fatal(err)
	}
	ke3, key, err := cl.Finish(ke2, fp, p)
	if err != nil {
		return "", "", err
	}
	if _, err := sl.SAS(joinID); err == nil {
		t.Fatal("server SAS before KE3 was verified")
	}
	if err := sl.Finish(ke3); err != nil {
		t.Fatal(err)
	}
	srv, err := sl.SAS(joinID)
	if err != nil {
		t.Fatal(err)
	}
	return SAS(key, joinID), srv, nil
}

// TestSASAgreesAndDiffersPerSession: both ends derive the same six
// digits; another session with the same secret and join id (a second
// machine holding the same code) derives other digits.
func TestSASAgreesAndDiffersPerSession(t *testing.T) {
	k, err := GenerateServerKeys()
	if err != nil {
		t.Fatal(err)
	}
	fp := bytes.Repeat([]byte{7}, 32)
	rec, err := k.Mint("4F", []byte("4F7K2Q9MXZT"), fp, CodeKSF)
	if err != nil {
		t.Fatal(err)
	}
	six := regexp.MustCompile(`^[0-9]{6}$`)
	seen := map[string]bool{}
	for range 4 {
		c, s, err := session(t, k, rec, CodeKSF, []byte("4F7K2Q9MXZT"), "join-1")
		if err != nil {
			t.Fatal(err)
		}
		if c != s || !six.MatchString(c) {
			t.Fatalf("client %q server %q", c, s)
		}
		seen[c] = true
	}
	if len(seen) < 3 { // four sessions: a repeat of 1e-6 odds twice over fails
		t.Fatalf("four sessions gave %d distinct SAS values", len(seen))
	}
	key := bytes.Repeat([]byte{9}, 64)
	if SAS(key, "join-1") == SAS(key, "join-2") && SAS(key, "join-1") == SAS(key, "join-3") {
		t.Fatal("the SAS does not depend on the join id")
	}
}

// TestNoKSF: a record minted without key stretching logs in with the
// identity KSF, and not with Argon2id parameters (nor the reverse).
func TestNoKSF(t *testing.T) {
	k, err := GenerateServerKeys()
	if err != nil {
		t.Fatal(err)
	}
	fp := bytes.Repeat([]byte{7}, 32)
	pw := []byte("bcjt_x.0123456789abcdefghjkmnpqrstv")
	rec, err := k.Mint("4F", pw, fp, NoKSF)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := session(t, k, rec, NoKSF, pw, "j"); err != nil {
		t.Fatalf("identity KSF: %v", err)
	}
	if _, _, err := session(t, k, rec, CodeKSF, pw, "j"); err != ErrNotAccepted {
		t.Fatalf("argon2id against an unstretched record: %v", err)
	}
	old, err := k.Mint("4F", pw, fp, CodeKSF)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := session(t, k, old, CodeKSF, pw, "j"); err != nil {
		t.Fatalf("a record minted with argon2id keeps working: %v", err)
	}
	if NoKSF.Check() != nil || NoKSF.CheckArgon2id() == nil {
		t.Fatal("NoKSF is accepted in general and refused where Argon2id is required")
	}
}
