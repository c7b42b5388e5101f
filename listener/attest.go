package listener

import (
	"crypto"
	"errors"
	"fmt"
	"time"

	"github.com/stratumjoin/stratum/internal/cluster"
	"github.com/stratumjoin/stratum/internal/tpm"
	"github.com/stratumjoin/stratum/internal/wire"
)

// attestTimeout bounds the agent's TPM work between challenge and answer
// (credential activation and a certification: milliseconds on a TPM,
// seconds on a slow or busy one).
const attestTimeout = 30 * time.Second

// attest runs the TPM round trip of a join whose KE3 verified (so only a
// code holder gets a challenge): a credential for the claimed EK and AK,
// then the answer's check. A refusal is returned as its sentence (it goes
// into the prove transaction, which spends no use on it); err is a
// transport failure.
func (l *Listener) attest(str Stream, claim *wire.TPMClaim, csrKey crypto.PublicKey) (verdict *cluster.TPMVerdict, refusal string, err error) {
	p, ch, err := l.tpm.Challenge(tpm.Claim{EKPublic: claim.EKPublic, EKCert: claim.EKCert, AKPublic: claim.AKPublic, KeyPublic: claim.KeyPublic}, csrKey)
	if errors.Is(err, tpm.ErrAttestation) {
		return nil, err.Error(), nil
	}
	if err != nil {
		return nil, "", err
	}
	if err := wire.Write(str, &wire.TPMChallenge{Credential: ch.Credential, Secret: ch.Secret, Nonce: ch.Nonce}); err != nil {
		return nil, "", err
	}
	str.SetReadDeadline(time.Now().Add(attestTimeout))
	var ans wire.TPMAnswer
	if err := l.fromPeer(func() error { return wire.Read(str, &ans) }); err != nil {
		return nil, "", fmt.Errorf("read tpm answer: %w", err)
	}
	str.SetReadDeadline(time.Time{})
	v, err := p.Check(tpm.Answer{Secret: ans.Secret, CertifyInfo: ans.CertifyInfo, Signature: ans.Signature})
	if err != nil {
		return nil, err.Error(), nil
	}
	return &cluster.TPMVerdict{EKHash: v.EKHash, EKCertVerified: v.EKCertVerified, EKIssuer: v.EKIssuer}, "", nil
}

// poolRequiresTPM reads the registry policy of pool.
func (l *Listener) poolRequiresTPM(pool string) bool {
	p, ok := l.Registry().Pool(pool)
	return ok && p.Policy.RequireTPM
}
