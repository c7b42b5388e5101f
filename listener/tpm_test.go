package listener_test

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"testing"

	"github.com/stratumjoin/stratum/internal/tpm"
	"github.com/stratumjoin/stratum/internal/tpm/swtpmtest"
	"github.com/stratumjoin/stratum/internal/wire"
	"github.com/stratumjoin/stratum/listener/adminapi"
	"github.com/stratumjoin/stratum/listener/listenertest"
)

// tpmAgent is one machine's TPM and node key, driven by hand.
type tpmAgent struct {
	tp  *tpm.TPM
	key *tpm.Key
	csr []byte
}

func newTPMAgent(t *testing.T, sim *swtpmtest.Sim) *tpmAgent {
	t.Helper()
	tp := sim.Open()
	t.Cleanup(func() { tp.Close() })
	b, err := tp.CreateKey()
	if err != nil {
		t.Fatal(err)
	}
	k, err := tp.LoadKey(b)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, k)
	if err != nil {
		t.Fatal(err)
	}
	return &tpmAgent{tp: tp, key: k, csr: csr}
}

func (a *tpmAgent) attest(t *testing.T) *tpm.Attestation {
	t.Helper()
	att, err := a.tp.Attest(a.key.Blobs())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(att.Close)
	return att
}

func claim(c tpm.Claim) *wire.TPMClaim {
	return &wire.TPMClaim{EKPublic: c.EKPublic, EKCert: c.EKCert, AKPublic: c.AKPublic, KeyPublic: c.KeyPublic}
}

func answerWith(t *testing.T, att *tpm.Attestation, keep **wire.TPMAnswer) func(*wire.TPMChallenge) *wire.TPMAnswer {
	return func(ch *wire.TPMChallenge) *wire.TPMAnswer {
		a, err := att.Answer(tpm.Challenge{Credential: ch.Credential, Secret: ch.Secret, Nonce: ch.Nonce})
		if err != nil {
			t.Errorf("TPM answer: %v", err)
			return nil
		}
		w := &wire.TPMAnswer{Secret: a.Secret, CertifyInfo: a.CertifyInfo, Signature: a.Signature}
		if keep != nil {
			*keep = w
		}
		return w
	}
}

// TestTPMAttestationCannotBeReplayed, over real QUIC against swtpm: a
// recorded answer, a claim of another TPM's EK and another TPM's answer
// are each refused, and none spends a use.
func TestTPMAttestationCannotBeReplayed(t *testing.T) {
	simA, simB := swtpmtest.Start(t), swtpmtest.Start(t)
	a := newTPMAgent(t, simA)
	l := listenertest.Start(t, listenertest.Options{})
	ctx := context.Background()
	max := 10
	sec, code := l.MintCode(t, adminapi.MintCodeRequest{AutoApprove: true, MaxUses: &max, AllowReclaim: true})
	uses := func() int {
		t.Helper()
		c, err := l.Admin.Code(ctx, code.ID)
		if err != nil {
			t.Fatal(err)
		}
		return c.Uses
	}
	refusedNoUse := func(what string, out rawOutcome, err error, before int) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if len(out.Results) != 1 || out.Results[0].Code != wire.CodeTPMRequired || uses() != before {
			t.Fatalf("%s: results %+v, uses %d (was %d)", what, out.Results, uses(), before)
		}
	}

	// an honest join, whose answer is recorded
	attA := a.attest(t)
	var recorded *wire.TPMAnswer
	out, err := rawJoin{Secret: sec, CSR: a.csr, TPM: claim(attA.Claim), OnTPM: answerWith(t, attA, &recorded)}.run(ctx, l.Endpoint)
	if err != nil || len(out.Results) != 1 || out.Results[0].Status != wire.StatusJoined || uses() != 1 {
		t.Fatalf("honest TPM join: %+v, %v", out.Results, err)
	}

	// the recorded answer, sent to a new challenge
	out, err = rawJoin{Secret: sec, CSR: a.csr, TPM: claim(attA.Claim), OnTPM: func(*wire.TPMChallenge) *wire.TPMAnswer { return recorded }}.run(ctx, l.Endpoint)
	refusedNoUse("a recorded answer", out, err, 1)

	// B claims A's EK (public, so anyone may copy it) for its own AK and
	// key: it cannot activate the credential, so it sends what it has
	b := newTPMAgent(t, simB)
	attB := b.attest(t)
	forged := attB.Claim
	forged.EKPublic, forged.EKCert = attA.Claim.EKPublic, attA.Claim.EKCert
	out, err = rawJoin{Secret: sec, CSR: b.csr, TPM: claim(forged), OnTPM: func(ch *wire.TPMChallenge) *wire.TPMAnswer {
		if _, err := attB.Answer(tpm.Challenge{Credential: ch.Credential, Secret: ch.Secret, Nonce: ch.Nonce}); err == nil {
			t.Error("TPM B activated a credential made for TPM A's EK")
		}
		return &wire.TPMAnswer{Secret: make([]byte, 32), CertifyInfo: recorded.CertifyInfo, Signature: recorded.Signature}
	}}.run(ctx, l.Endpoint)
	refusedNoUse("a claim of another TPM's EK", out, err, 1)

	// B's genuine answer to its own challenge, sent in A's join
	attB.Close() // swtpm has three object slots
	attB2 := b.attest(t)
	var ofB *wire.TPMAnswer
	if _, err := (rawJoin{Secret: sec, CSR: b.csr, TPM: claim(attB2.Claim), OnTPM: func(ch *wire.TPMChallenge) *wire.TPMAnswer {
		answerWith(t, attB2, &ofB)(ch)
		return nil // withheld: used below
	}}).run(ctx, l.Endpoint); err != nil || ofB == nil {
		t.Fatalf("B's challenge: %v", err)
	}
	attA.Close()
	attA2 := a.attest(t)
	out, err = rawJoin{Secret: sec, CSR: a.csr, TPM: claim(attA2.Claim), OnTPM: func(*wire.TPMChallenge) *wire.TPMAnswer { return ofB }}.run(ctx, l.Endpoint)
	refusedNoUse("another TPM's answer", out, err, 1)
}
