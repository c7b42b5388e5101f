package tpm_test

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"strings"
	"testing"

	"github.com/stratumjoin/stratum/internal/tpm"
	"github.com/stratumjoin/stratum/internal/tpm/swtpmtest"
)

func newKey(t *testing.T, tp *tpm.TPM) *tpm.Key {
	t.Helper()
	b, err := tp.CreateKey()
	if err != nil {
		t.Fatal(err)
	}
	k, err := tp.LoadKey(b)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestKeySignsInTPMAndSurvivesPowerCycle(t *testing.T) {
	sim := swtpmtest.Start(t)
	tp := sim.Open()
	k := newKey(t, tp)
	tp.Close()
	sim.Restart()
	tp = sim.Open()
	defer tp.Close()
	k2, err := tp.LoadKey(k.Blobs())
	if err != nil {
		t.Fatalf("reload after power cycle: %v", err)
	}
	digest := sha256.Sum256([]byte("hello"))
	sig, err := k2.Sign(rand.Reader, digest[:], crypto.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	if !ecdsa.VerifyASN1(k.Public().(*ecdsa.PublicKey), digest[:], sig) {
		t.Fatal("TPM signature does not verify under the key's public area")
	}
}

func TestKeyOfAnotherOrClearedTPMDoesNotLoad(t *testing.T) {
	a, b := swtpmtest.Start(t), swtpmtest.Start(t)
	ta := a.Open()
	k := newKey(t, ta)
	ta.Close()
	tb := b.Open()
	_, err := tb.LoadKey(k.Blobs())
	tb.Close()
	if !errors.Is(err, tpm.ErrKeyNotLoadable) {
		t.Fatalf("blobs on another TPM: %v, want ErrKeyNotLoadable", err)
	}
	a.Clear()
	ta = a.Open()
	defer ta.Close()
	if _, err := ta.LoadKey(k.Blobs()); !errors.Is(err, tpm.ErrKeyNotLoadable) {
		t.Fatalf("blobs after TPM2_Clear: %v, want ErrKeyNotLoadable", err)
	}
}

// attest runs the agent side of an attestation against v.
func attest(t *testing.T, tp *tpm.TPM, k *tpm.Key, v *tpm.Verifier) (tpm.Verdict, error) {
	t.Helper()
	a, err := tp.Attest(k.Blobs())
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	p, ch, err := v.Challenge(a.Claim, k.Public())
	if err != nil {
		return tpm.Verdict{}, err
	}
	ans, err := a.Answer(ch)
	if err != nil {
		t.Fatal(err)
	}
	return p.Check(ans)
}

func TestAttestationWithManufacturerChain(t *testing.T) {
	sim := swtpmtest.Start(t)
	ca := swtpmtest.NewCA(t, "Test TPM Maker")
	ekCert := sim.Provision(ca)
	ekHash := sim.EKHash() // swtpm serves one connection at a time
	tp := sim.Open()
	defer tp.Close()
	k := newKey(t, tp)

	v := tpm.NewVerifier([]*x509.Certificate{ca.Cert})
	got, err := attest(t, tp, k, v)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(ekCert.RawSubjectPublicKeyInfo)
	if !got.EKCertVerified || got.EKHash != ekHash || got.EKHash != strings.ToLower(hexOf(sum[:])) {
		t.Fatalf("verdict %+v, want the EK certificate verified and hash %x", got, sum)
	}

	// another manufacturer's roots do not accept it
	other := tpm.NewVerifier([]*x509.Certificate{swtpmtest.NewCA(t, "Other Maker").Cert})
	if _, err := attest(t, tp, k, other); !errors.Is(err, tpm.ErrAttestation) || !strings.Contains(err.Error(), "does not chain") {
		t.Fatalf("foreign roots: %v", err)
	}
	// without roots the EK is taken as an identity
	got, err = attest(t, tp, k, tpm.NewVerifier(nil))
	if err != nil || got.EKCertVerified || got.EKHash != ekHash {
		t.Fatalf("no roots: %+v, %v", got, err)
	}
}

func TestAttestationRefusals(t *testing.T) {
	a, b := swtpmtest.Start(t), swtpmtest.Start(t)
	ta, tb := a.Open(), b.Open()
	defer ta.Close()
	defer tb.Close()
	ka, kb := newKey(t, ta), newKey(t, tb)
	v := tpm.NewVerifier(nil)

	t.Run("csr for another key", func(t *testing.T) {
		att, err := ta.Attest(ka.Blobs())
		if err != nil {
			t.Fatal(err)
		}
		defer att.Close()
		if _, _, err := v.Challenge(att.Claim, kb.Public()); !errors.Is(err, tpm.ErrAttestation) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("claim of another TPM's EK", func(t *testing.T) {
		// B claims A's EK (public, so anyone can copy it) with its own AK
		// and key: B cannot activate a credential made for A's EK.
		attA, err := ta.Attest(ka.Blobs())
		if err != nil {
			t.Fatal(err)
		}
		attA.Close()
		attB, err := tb.Attest(kb.Blobs())
		if err != nil {
			t.Fatal(err)
		}
		defer attB.Close()
		claim := attB.Claim
		claim.EKPublic, claim.EKCert = attA.Claim.EKPublic, attA.Claim.EKCert
		_, ch, err := v.Challenge(claim, kb.Public())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := attB.Answer(ch); err == nil {
			t.Fatal("a TPM activated a credential made for another TPM's EK")
		}
	})
	t.Run("answer replayed to a new challenge", func(t *testing.T) {
		att, err := ta.Attest(ka.Blobs())
		if err != nil {
			t.Fatal(err)
		}
		defer att.Close()
		_, ch, err := v.Challenge(att.Claim, ka.Public())
		if err != nil {
			t.Fatal(err)
		}
		recorded, err := att.Answer(ch)
		if err != nil {
			t.Fatal(err)
		}
		p2, _, err := v.Challenge(att.Claim, ka.Public())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p2.Check(recorded); !errors.Is(err, tpm.ErrAttestation) {
			t.Fatalf("replayed answer: %v", err)
		}
	})
	t.Run("answer of another TPM", func(t *testing.T) {
		attA, err := ta.Attest(ka.Blobs())
		if err != nil {
			t.Fatal(err)
		}
		defer attA.Close()
		pA, _, err := v.Challenge(attA.Claim, ka.Public())
		if err != nil {
			t.Fatal(err)
		}
		attB, err := tb.Attest(kb.Blobs())
		if err != nil {
			t.Fatal(err)
		}
		defer attB.Close()
		_, chB, err := v.Challenge(attB.Claim, kb.Public())
		if err != nil {
			t.Fatal(err)
		}
		ansB, err := attB.Answer(chB)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := pA.Check(ansB); !errors.Is(err, tpm.ErrAttestation) {
			t.Fatalf("B's answer to A's challenge: %v", err)
		}
	})
}

func hexOf(b []byte) string {
	const d = "0123456789abcdef"
	out := make([]byte, 0, 2*len(b))
	for _, c := range b {
		out = append(out, d[c>>4], d[c&15])
	}
	return string(out)
}
