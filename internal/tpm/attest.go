package tpm

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport"
)

// EKCertIndex is the NV index of the RSA-2048 EK certificate (TCG EK
// Credential Profile).
const EKCertIndex = 0x01c00002

// Claim is what the agent sends after the PAKE: the endorsement key, its
// certificate when the TPM holds one, an attestation key (AK) and the
// node key's public area.
type Claim struct {
	EKPublic  []byte // TPM2B_PUBLIC
	EKCert    []byte // DER; nil when the TPM holds none
	AKPublic  []byte // TPM2B_PUBLIC
	KeyPublic []byte // TPM2B_PUBLIC
}

// Challenge is the listener's credential: a secret only the TPM that
// holds both the EK and the named AK can recover, and a nonce the
// certification of the node key must carry.
type Challenge struct {
	Credential []byte // TPM2B_ID_OBJECT contents
	Secret     []byte // TPM2B_ENCRYPTED_SECRET contents
	Nonce      []byte
}

// Answer proves the claim: the recovered secret, and TPM2_Certify of the
// node key by the AK over the nonce.
type Answer struct {
	Secret      []byte
	CertifyInfo []byte // TPMS_ATTEST
	Signature   []byte // TPMT_SIGNATURE
}

// akTemplate is a restricted P-256 signing key in the endorsement
// hierarchy: it signs only structures the TPM itself produced.
var akTemplate = tpm2.TPMTPublic{
	Type:    tpm2.TPMAlgECC,
	NameAlg: tpm2.TPMAlgSHA256,
	ObjectAttributes: tpm2.TPMAObject{
		FixedTPM:            true,
		FixedParent:         true,
		SensitiveDataOrigin: true,
		UserWithAuth:        true,
		NoDA:                true,
		Restricted:          true,
		SignEncrypt:         true,
	},
	Parameters: tpm2.NewTPMUPublicParms(tpm2.TPMAlgECC, &tpm2.TPMSECCParms{
		CurveID: tpm2.TPMECCNistP256,
		Scheme: tpm2.TPMTECCScheme{
			Scheme:  tpm2.TPMAlgECDSA,
			Details: tpm2.NewTPMUAsymScheme(tpm2.TPMAlgECDSA, &tpm2.TPMSSigSchemeECDSA{HashAlg: tpm2.TPMAlgSHA256}),
		},
	}),
	Unique: tpm2.NewTPMUPublicID(tpm2.TPMAlgECC, &tpm2.TPMSECCPoint{
		X: tpm2.TPM2BECCParameter{Buffer: make([]byte, 32)},
		Y: tpm2.TPM2BECCParameter{Buffer: make([]byte, 32)},
	}),
}

// Attestation is one attestation in progress on the agent: the EK and the
// AK stay loaded until the answer or Close.
type Attestation struct {
	t      *TPM
	ek, ak tpm2.NamedHandle
	key    Blobs
	Claim  Claim
}

func (t *TPM) ek() (tpm2.NamedHandle, []byte, error) {
	rsp, err := tpm2.CreatePrimary{PrimaryHandle: tpm2.TPMRHEndorsement, InPublic: tpm2.New2B(tpm2.RSAEKTemplate)}.Execute(t)
	if err != nil {
		return tpm2.NamedHandle{}, nil, fmt.Errorf("create endorsement key: %w", err)
	}
	return tpm2.NamedHandle{Handle: rsp.ObjectHandle, Name: rsp.Name}, tpm2.Marshal(rsp.OutPublic), nil
}

// EKHash is the SHA-256 of the EK's public key (DER SubjectPublicKeyInfo,
// as in its certificate), in hex: what `--expect-ek` pins.
func (t *TPM) EKHash() (string, error) {
	h, pub, err := t.ek()
	if err != nil {
		return "", err
	}
	t.flush(h.Handle)
	return EKHashOf(pub)
}

// EKHashOf is the EK hash of a TPM2B_PUBLIC.
func EKHashOf(public []byte) (string, error) {
	der, err := publicDER(public)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(der)
	return hex.EncodeToString(sum[:]), nil
}

func publicDER(public []byte) ([]byte, error) {
	area, err := publicArea(public)
	if err != nil {
		return nil, err
	}
	k, err := tpm2.Pub(*area)
	if err != nil {
		return nil, fmt.Errorf("public area: %w", err)
	}
	return x509.MarshalPKIXPublicKey(k)
}

func publicArea(public []byte) (*tpm2.TPMTPublic, error) {
	pub, err := tpm2.Unmarshal[tpm2.TPM2BPublic](public)
	if err != nil {
		return nil, fmt.Errorf("parse public area: %w", err)
	}
	area, err := pub.Contents()
	if err != nil {
		return nil, fmt.Errorf("parse public area: %w", err)
	}
	return area, nil
}

// EKCert reads the EK certificate from its NV index; nil when there is
// none.
func (t *TPM) EKCert() ([]byte, error) {
	rp, err := tpm2.NVReadPublic{NVIndex: tpm2.TPMHandle(EKCertIndex)}.Execute(t)
	if err != nil {
		if errors.Is(err, tpm2.TPMRCHandle) {
			return nil, nil
		}
		return nil, fmt.Errorf("read EK certificate index: %w", err)
	}
	nvpub, err := rp.NVPublic.Contents()
	if err != nil {
		return nil, fmt.Errorf("read EK certificate index: %w", err)
	}
	idx := tpm2.NamedHandle{Handle: tpm2.TPMHandle(EKCertIndex), Name: rp.NVName}
	var out []byte
	for off := 0; off < int(nvpub.DataSize); {
		n := min(int(nvpub.DataSize)-off, 512)
		r, err := tpm2.NVRead{AuthHandle: tpm2.TPMRHOwner, NVIndex: idx, Size: uint16(n), Offset: uint16(off)}.Execute(t)
		if err != nil {
			return nil, fmt.Errorf("read EK certificate: %w", err)
		}
		out = append(out, r.Data.Buffer...)
		off += n
	}
	// the index may be larger than the certificate: keep the DER only
	if c, err := x509.ParseCertificate(trimDER(out)); err == nil {
		return c.Raw, nil
	}
	return nil, errors.New("the TPM's EK certificate index holds no certificate")
}

// trimDER cuts b to the length its outer DER header gives.
func trimDER(b []byte) []byte {
	if len(b) < 4 || b[0] != 0x30 {
		return b
	}
	if b[1] == 0x82 {
		if n := 4 + (int(b[2])<<8 | int(b[3])); n <= len(b) {
			return b[:n]
		}
	}
	return b
}

// Attest loads the EK and an AK and returns the claim about key to send.
func (t *TPM) Attest(key Blobs) (*Attestation, error) {
	cert, err := t.EKCert()
	if err != nil {
		return nil, err
	}
	// The EK and the AK stay loaded until the answer: a TPM without a
	// resource manager has three object slots, so sign nothing with the
	// node key in between (it takes two more); make the CSR first.
	ek, ekPub, err := t.ek()
	if err != nil {
		return nil, err
	}
	ak, err := tpm2.CreatePrimary{PrimaryHandle: tpm2.TPMRHEndorsement, InPublic: tpm2.New2B(akTemplate)}.Execute(t)
	if err != nil {
		t.flush(ek.Handle)
		return nil, fmt.Errorf("create attestation key: %w", err)
	}
	return &Attestation{
		t: t, ek: ek, ak: tpm2.NamedHandle{Handle: ak.ObjectHandle, Name: ak.Name}, key: key,
		Claim: Claim{EKPublic: ekPub, EKCert: cert, AKPublic: tpm2.Marshal(ak.OutPublic), KeyPublic: key.Public},
	}, nil
}

// ekPolicy satisfies the EK's policy: PolicySecret on the endorsement
// hierarchy.
func ekPolicy(t transport.TPM, h tpm2.TPMISHPolicy, nonceTPM tpm2.TPM2BNonce) error {
	_, err := tpm2.PolicySecret{AuthHandle: tpm2.TPMRHEndorsement, PolicySession: h, NonceTPM: nonceTPM}.Execute(t)
	return err
}

// Answer recovers the credential's secret and certifies the node key with
// the AK over the challenge's nonce.
func (a *Attestation) Answer(ch Challenge) (Answer, error) {
	if a.ek.Handle == 0 {
		return Answer{}, errors.New("attestation already answered")
	}
	act, err := tpm2.ActivateCredential{
		ActivateHandle: tpm2.AuthHandle{Handle: a.ak.Handle, Name: a.ak.Name, Auth: tpm2.PasswordAuth(nil)},
		KeyHandle:      tpm2.AuthHandle{Handle: a.ek.Handle, Name: a.ek.Name, Auth: tpm2.Policy(tpm2.TPMAlgSHA256, 16, ekPolicy)},
		CredentialBlob: tpm2.TPM2BIDObject{Buffer: ch.Credential},
		Secret:         tpm2.TPM2BEncryptedSecret{Buffer: ch.Secret},
	}.Execute(a.t)
	// the EK is done: free its slot for the node key
	a.t.flush(a.ek.Handle)
	a.ek = tpm2.NamedHandle{}
	if err != nil {
		return Answer{}, fmt.Errorf("activate the listener's credential: %w", err)
	}
	key, err := a.t.load(a.key)
	if err != nil {
		return Answer{}, err
	}
	defer a.t.flush(key.Handle)
	cert, err := tpm2.Certify{
		ObjectHandle:   tpm2.AuthHandle{Handle: key.Handle, Name: key.Name, Auth: tpm2.PasswordAuth(nil)},
		SignHandle:     tpm2.AuthHandle{Handle: a.ak.Handle, Name: a.ak.Name, Auth: tpm2.PasswordAuth(nil)},
		QualifyingData: tpm2.TPM2BData{Buffer: ch.Nonce},
		InScheme:       tpm2.TPMTSigScheme{Scheme: tpm2.TPMAlgNull},
	}.Execute(a.t)
	if err != nil {
		return Answer{}, fmt.Errorf("certify the node key: %w", err)
	}
	return Answer{Secret: act.CertInfo.Buffer, CertifyInfo: cert.CertifyInfo.Bytes(), Signature: tpm2.Marshal(cert.Signature)}, nil
}

// Close flushes what the attestation holds loaded; a second Close does
// nothing.
func (a *Attestation) Close() {
	for _, h := range []*tpm2.NamedHandle{&a.ek, &a.ak} {
		if h.Handle != 0 {
			a.t.flush(h.Handle)
			*h = tpm2.NamedHandle{}
		}
	}
}
