package tpm

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"testing"

	"github.com/google/go-tpm/tpm2"
)

// softClaim builds a claim from software keys in the TPM's encodings: it
// parses like a real one (its credential can never be activated).
func softClaim(t testing.TB) (Claim, *ecdsa.PublicKey) {
	rk, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	ek := tpm2.RSAEKTemplate
	ek.Unique = tpm2.NewTPMUPublicID(tpm2.TPMAlgRSA, &tpm2.TPM2BPublicKeyRSA{Buffer: rk.N.Bytes()})
	ecc := func(tmpl tpm2.TPMTPublic) ([]byte, *ecdsa.PublicKey) {
		k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		x, y := make([]byte, 32), make([]byte, 32)
		k.X.FillBytes(x)
		k.Y.FillBytes(y)
		tmpl.Unique = tpm2.NewTPMUPublicID(tpm2.TPMAlgECC, &tpm2.TPMSECCPoint{X: tpm2.TPM2BECCParameter{Buffer: x}, Y: tpm2.TPM2BECCParameter{Buffer: y}})
		return tpm2.Marshal(tpm2.New2B(tmpl)), &k.PublicKey
	}
	ak, _ := ecc(akTemplate)
	key, keyPub := ecc(nodeKeyTemplate)
	return Claim{EKPublic: tpm2.Marshal(tpm2.New2B(ek)), AKPublic: ak, KeyPublic: key}, keyPub
}

// FuzzVerify feeds arbitrary claims and answers to the listener's
// verifier: it must refuse them without panicking.
func FuzzVerify(f *testing.F) {
	c, _ := softClaim(f)
	good, goodKey := softClaim(f)
	f.Add(c.EKPublic, c.AKPublic, c.KeyPublic, []byte(nil), []byte{1}, []byte{2})
	f.Add(c.EKPublic[:10], c.AKPublic, c.KeyPublic[1:], []byte{0x30}, []byte(nil), []byte{0, 0x18, 0, 0xb})
	v := NewVerifier(nil)
	f.Fuzz(func(t *testing.T, ekPub, akPub, keyPub, ekCert, certifyInfo, sig []byte) {
		// goodKey is not the key of any fuzzed claim (its public area is
		// random to the fuzzer), so nothing may pass
		if _, _, err := v.Challenge(Claim{EKPublic: ekPub, EKCert: ekCert, AKPublic: akPub, KeyPublic: keyPub}, goodKey); err == nil && string(keyPub) != string(good.KeyPublic) {
			t.Fatal("a claim for another key than the CSR's passed")
		}
		p, _, err := v.Challenge(good, goodKey)
		if err != nil {
			t.Fatalf("a well-formed claim: %v", err)
		}
		// with the right secret, the certification is parsed and checked:
		// no AK private key signed it, so it cannot pass
		if _, err := p.Check(Answer{Secret: p.secret, CertifyInfo: certifyInfo, Signature: sig}); err == nil {
			t.Fatal("an answer made without the TPM passed")
		}
	})
}
