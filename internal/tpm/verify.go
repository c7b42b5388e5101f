package tpm

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
	"encoding/asn1"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"slices"

	"github.com/google/go-tpm/tpm2"
)

// Verifier checks attestations on the listener. It needs no TPM.
type Verifier struct {
	roots, inter *x509.CertPool
}

// NewVerifier returns a verifier; with manufacturer certificates (see
// LoadCADir), every EK must come with a certificate that chains to them.
// Without, the EK is taken as it is: its hash is an identity an operator
// can pin, not proof of a genuine TPM.
func NewVerifier(manufacturerCerts []*x509.Certificate) *Verifier {
	if len(manufacturerCerts) == 0 {
		return &Verifier{}
	}
	v := &Verifier{roots: x509.NewCertPool(), inter: x509.NewCertPool()}
	for _, c := range manufacturerCerts {
		if bytes.Equal(c.RawIssuer, c.RawSubject) && c.CheckSignatureFrom(c) == nil {
			v.roots.AddCert(c)
		} else {
			v.inter.AddCert(c)
		}
	}
	return v
}

// ChecksChain reports whether the verifier has manufacturer roots.
func (v *Verifier) ChecksChain() bool { return v.roots != nil }

// LoadCADir reads every PEM or DER certificate in dir (TPM manufacturers
// publish both): the roots and intermediates EK certificates chain to.
func LoadCADir(dir string) ([]*x509.Certificate, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("tpm ca dir: %w", err)
	}
	var out []*x509.Certificate
	for _, e := range ents {
		if e.IsDir() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("tpm ca dir: %w", err)
		}
		certs, err := parseCertFile(b)
		if err != nil {
			return nil, fmt.Errorf("tpm ca dir: %s: %w", e.Name(), err)
		}
		out = append(out, certs...)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("tpm ca dir %s holds no certificates", dir)
	}
	return out, nil
}

func parseCertFile(b []byte) ([]*x509.Certificate, error) {
	if c, err := x509.ParseCertificate(b); err == nil {
		return []*x509.Certificate{c}, nil
	}
	var out []*x509.Certificate
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, errors.New("no PEM or DER certificate")
	}
	return out, nil
}

// Verdict is what a verified attestation establishes.
type Verdict struct {
	// EKHash is the SHA-256 of the EK's public key, hex.
	EKHash string
	// EKCertVerified: the EK certificate chains to the manufacturer roots
	// the listener was given.
	EKCertVerified bool
	// EKIssuer names the EK certificate's issuer, when there is one.
	EKIssuer string
}

// Pending is a challenge sent and not yet answered.
type Pending struct {
	secret, nonce []byte
	akPub         *ecdsa.PublicKey
	keyName       []byte
	verdict       Verdict
}

// ErrAttestation marks every reason an attestation is refused.
var ErrAttestation = errors.New("TPM attestation refused")

func refuse(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrAttestation, fmt.Sprintf(format, args...))
}

// Challenge checks a claim about csrKey (the key the certificate is asked
// for) and makes the credential only the claimed TPM can activate.
func (v *Verifier) Challenge(c Claim, csrKey crypto.PublicKey) (*Pending, Challenge, error) {
	ek, err := publicArea(c.EKPublic)
	if err != nil {
		return nil, Challenge{}, refuse("endorsement key: %v", err)
	}
	a := ek.ObjectAttributes
	if ek.NameAlg != tpm2.TPMAlgSHA256 || !a.FixedTPM || !a.FixedParent || !a.Restricted || !a.Decrypt || a.SignEncrypt {
		return nil, Challenge{}, refuse("the endorsement key's attributes are not those of an EK")
	}
	ekDER, err := publicDER(c.EKPublic)
	if err != nil {
		return nil, Challenge{}, refuse("endorsement key: %v", err)
	}
	sum := sha256.Sum256(ekDER)
	verdict := Verdict{EKHash: fmt.Sprintf("%x", sum)}
	if len(c.EKCert) > 0 {
		cert, err := x509.ParseCertificate(c.EKCert)
		if err != nil {
			return nil, Challenge{}, refuse("EK certificate: %v", err)
		}
		if !bytes.Equal(cert.RawSubjectPublicKeyInfo, ekDER) {
			return nil, Challenge{}, refuse("the EK certificate is for another key")
		}
		verdict.EKIssuer = cert.Issuer.String()
		if v.roots != nil {
			if err := v.verifyChain(cert); err != nil {
				return nil, Challenge{}, refuse("the EK certificate does not chain to the TPM manufacturer roots (--tpm-ca-dir): %v", err)
			}
			verdict.EKCertVerified = true
		}
	} else if v.roots != nil {
		return nil, Challenge{}, refuse("the TPM has no EK certificate, and this listener accepts only TPMs whose EK certificate chains to its manufacturer roots (--tpm-ca-dir)")
	}

	ak, err := publicArea(c.AKPublic)
	if err != nil {
		return nil, Challenge{}, refuse("attestation key: %v", err)
	}
	a = ak.ObjectAttributes
	if ak.NameAlg != tpm2.TPMAlgSHA256 || !a.FixedTPM || !a.Restricted || !a.SignEncrypt || a.Decrypt {
		return nil, Challenge{}, refuse("the attestation key is not a restricted signing key fixed to its TPM")
	}
	akPub, err := eccPublic(ak)
	if err != nil {
		return nil, Challenge{}, refuse("attestation key: %v", err)
	}
	akName, err := tpm2.ObjectName(ak)
	if err != nil {
		return nil, Challenge{}, refuse("attestation key: %v", err)
	}

	key, err := publicArea(c.KeyPublic)
	if err != nil {
		return nil, Challenge{}, refuse("node key: %v", err)
	}
	a = key.ObjectAttributes
	if key.NameAlg != tpm2.TPMAlgSHA256 || !a.FixedTPM || !a.FixedParent || !a.SensitiveDataOrigin || !a.SignEncrypt {
		return nil, Challenge{}, refuse("the node key is not a signing key created in and fixed to its TPM")
	}
	keyPub, err := eccPublic(key)
	if err != nil {
		return nil, Challenge{}, refuse("node key: %v", err)
	}
	if csrPub, ok := csrKey.(*ecdsa.PublicKey); !ok || !keyPub.Equal(csrPub) {
		return nil, Challenge{}, refuse("the certificate request is for another key than the TPM's")
	}
	keyName, err := tpm2.ObjectName(key)
	if err != nil {
		return nil, Challenge{}, refuse("node key: %v", err)
	}

	encap, err := tpm2.ImportEncapsulationKey(ek)
	if err != nil {
		return nil, Challenge{}, refuse("endorsement key: %v", err)
	}
	p := &Pending{secret: make([]byte, 32), nonce: make([]byte, 32), akPub: akPub, keyName: keyName.Buffer, verdict: verdict}
	rand.Read(p.secret)
	rand.Read(p.nonce)
	idObject, encSecret, err := tpm2.CreateCredential(rand.Reader, encap, akName.Buffer, p.secret)
	if err != nil {
		return nil, Challenge{}, fmt.Errorf("make credential: %w", err)
	}
	return p, Challenge{Credential: idObject, Secret: encSecret, Nonce: slices.Clone(p.nonce)}, nil
}

// oidSAN is subjectAltName. The TCG EK profile makes it critical and fills
// it with a directoryName naming the TPM's manufacturer, model and
// version, which crypto/x509 does not interpret; it names no host, so it
// plays no part in the chain check.
var oidSAN = asn1.ObjectIdentifier{2, 5, 29, 17}

func (v *Verifier) verifyChain(cert *x509.Certificate) error {
	c := *cert
	c.UnhandledCriticalExtensions = slices.DeleteFunc(slices.Clone(c.UnhandledCriticalExtensions), func(o asn1.ObjectIdentifier) bool { return o.Equal(oidSAN) })
	// EK certificates carry the TCG EK certificate purpose, not a TLS one
	_, err := c.Verify(x509.VerifyOptions{Roots: v.roots, Intermediates: v.inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	return err
}

// Check verifies the answer to the challenge.
func (p *Pending) Check(a Answer) (Verdict, error) {
	if subtle.ConstantTimeCompare(a.Secret, p.secret) != 1 {
		return Verdict{}, refuse("the credential was not activated by the TPM that holds this EK and AK")
	}
	sig, err := tpm2.Unmarshal[tpm2.TPMTSignature](a.Signature)
	if err != nil {
		return Verdict{}, refuse("certification signature: %v", err)
	}
	ecc, err := sig.Signature.ECDSA()
	if err != nil || sig.SigAlg != tpm2.TPMAlgECDSA || ecc.Hash != tpm2.TPMAlgSHA256 {
		return Verdict{}, refuse("certification signature is not ECDSA with SHA-256")
	}
	digest := sha256.Sum256(a.CertifyInfo)
	r, s := new(big.Int).SetBytes(ecc.SignatureR.Buffer), new(big.Int).SetBytes(ecc.SignatureS.Buffer)
	if !ecdsa.Verify(p.akPub, digest[:], r, s) {
		return Verdict{}, refuse("certification signature does not verify under the attestation key")
	}
	att, err := tpm2.Unmarshal[tpm2.TPMSAttest](a.CertifyInfo)
	if err != nil {
		return Verdict{}, refuse("certification: %v", err)
	}
	if att.Magic != tpm2.TPMGeneratedValue || att.Type != tpm2.TPMSTAttestCertify {
		return Verdict{}, refuse("certification is not a TPM-generated certify structure")
	}
	if !bytes.Equal(att.ExtraData.Buffer, p.nonce) {
		return Verdict{}, refuse("certification is for another challenge")
	}
	ci, err := att.Attested.Certify()
	if err != nil {
		return Verdict{}, refuse("certification: %v", err)
	}
	if !bytes.Equal(ci.Name.Buffer, p.keyName) {
		return Verdict{}, refuse("certification names another key than the node key")
	}
	return p.verdict, nil
}
