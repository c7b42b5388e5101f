package tpm

import (
	"crypto"
	"crypto/ecdsa"
	"encoding/asn1"
	"errors"
	"fmt"
	"io"
	"math/big"

	"github.com/google/go-tpm/tpm2"
)

// ErrKeyNotLoadable means the TPM refused the key blobs: they were made
// by another TPM, or this one was cleared (its storage root changed) since.
var ErrKeyNotLoadable = errors.New("the TPM cannot load this node's key: it was created in another TPM, or this TPM was cleared since (its storage root key changed); the node key is gone, join again with a new code")

// Blobs are a TPM-held key as it can be stored outside the TPM: the
// public area and the private area wrapped by the storage root key,
// useless to any other TPM.
type Blobs struct {
	Public  []byte // TPM2B_PUBLIC
	Private []byte // TPM2B_PRIVATE
}

// nodeKeyTemplate is the node key: ECC P-256 for signing, created inside
// the TPM (sensitiveDataOrigin), never duplicable (fixedTPM, fixedParent).
var nodeKeyTemplate = tpm2.TPMTPublic{
	Type:    tpm2.TPMAlgECC,
	NameAlg: tpm2.TPMAlgSHA256,
	ObjectAttributes: tpm2.TPMAObject{
		FixedTPM:            true,
		FixedParent:         true,
		SensitiveDataOrigin: true,
		UserWithAuth:        true,
		NoDA:                true,
		SignEncrypt:         true,
	},
	Parameters: tpm2.NewTPMUPublicParms(tpm2.TPMAlgECC, &tpm2.TPMSECCParms{
		CurveID: tpm2.TPMECCNistP256,
		Scheme:  tpm2.TPMTECCScheme{Scheme: tpm2.TPMAlgNull},
	}),
	Unique: tpm2.NewTPMUPublicID(tpm2.TPMAlgECC, &tpm2.TPMSECCPoint{
		X: tpm2.TPM2BECCParameter{Buffer: make([]byte, 32)},
		Y: tpm2.TPM2BECCParameter{Buffer: make([]byte, 32)},
	}),
}

// srk creates the storage root key (the TCG reference ECC SRK, the same
// every time until the owner hierarchy is cleared). The caller flushes it.
func (t *TPM) srk() (tpm2.NamedHandle, error) {
	rsp, err := tpm2.CreatePrimary{PrimaryHandle: tpm2.TPMRHOwner, InPublic: tpm2.New2B(tpm2.ECCSRKTemplate)}.Execute(t)
	if err != nil {
		return tpm2.NamedHandle{}, fmt.Errorf("create storage root key: %w", err)
	}
	return tpm2.NamedHandle{Handle: rsp.ObjectHandle, Name: rsp.Name}, nil
}

// CreateKey creates a node key under the storage root key and returns its
// blobs. The private part never leaves the TPM unwrapped.
func (t *TPM) CreateKey() (Blobs, error) {
	srk, err := t.srk()
	if err != nil {
		return Blobs{}, err
	}
	defer t.flush(srk.Handle)
	rsp, err := tpm2.Create{ParentHandle: srk, InPublic: tpm2.New2B(nodeKeyTemplate)}.Execute(t)
	if err != nil {
		return Blobs{}, fmt.Errorf("create node key in the TPM: %w", err)
	}
	return Blobs{Public: tpm2.Marshal(rsp.OutPublic), Private: tpm2.Marshal(rsp.OutPrivate)}, nil
}

// load loads a key under the storage root key; the caller flushes it.
func (t *TPM) load(b Blobs) (tpm2.NamedHandle, error) {
	pub, err := tpm2.Unmarshal[tpm2.TPM2BPublic](b.Public)
	if err != nil {
		return tpm2.NamedHandle{}, fmt.Errorf("parse key public blob: %w", err)
	}
	priv, err := tpm2.Unmarshal[tpm2.TPM2BPrivate](b.Private)
	if err != nil {
		return tpm2.NamedHandle{}, fmt.Errorf("parse key private blob: %w", err)
	}
	srk, err := t.srk()
	if err != nil {
		return tpm2.NamedHandle{}, err
	}
	defer t.flush(srk.Handle)
	rsp, err := tpm2.Load{ParentHandle: srk, InPrivate: *priv, InPublic: *pub}.Execute(t)
	if err != nil {
		var rc tpm2.TPMRC
		if errors.As(err, &rc) && !rc.IsWarning() {
			return tpm2.NamedHandle{}, fmt.Errorf("%w (%w)", ErrKeyNotLoadable, err)
		}
		return tpm2.NamedHandle{}, fmt.Errorf("load node key: %w", err)
	}
	return tpm2.NamedHandle{Handle: rsp.ObjectHandle, Name: rsp.Name}, nil
}

// Key is a node key held in a TPM. It implements crypto.Signer: each
// signature loads the key from its blobs, signs in the TPM and flushes
// it, so nothing stays occupied between handshakes.
type Key struct {
	tpm   *TPM
	blobs Blobs
	pub   *ecdsa.PublicKey
}

// LoadKey checks that the TPM accepts the blobs and returns the key.
func (t *TPM) LoadKey(b Blobs) (*Key, error) {
	pub, err := PublicKey(b.Public)
	if err != nil {
		return nil, err
	}
	h, err := t.load(b)
	if err != nil {
		return nil, err
	}
	t.flush(h.Handle)
	return &Key{tpm: t, blobs: b, pub: pub}, nil
}

// PublicKey is the P-256 public key of a TPM2B_PUBLIC blob.
func PublicKey(public []byte) (*ecdsa.PublicKey, error) {
	pub, err := tpm2.Unmarshal[tpm2.TPM2BPublic](public)
	if err != nil {
		return nil, fmt.Errorf("parse key public blob: %w", err)
	}
	area, err := pub.Contents()
	if err != nil {
		return nil, fmt.Errorf("parse key public blob: %w", err)
	}
	return eccPublic(area)
}

func eccPublic(area *tpm2.TPMTPublic) (*ecdsa.PublicKey, error) {
	k, err := tpm2.Pub(*area)
	if err != nil {
		return nil, fmt.Errorf("public area: %w", err)
	}
	ec, ok := k.(*ecdsa.PublicKey)
	if !ok {
		return nil, fmt.Errorf("public area holds a %T, want an ECC key", k)
	}
	return ec, nil
}

// Blobs are the key's stored form.
func (k *Key) Blobs() Blobs { return k.blobs }

// Public implements crypto.Signer.
func (k *Key) Public() crypto.PublicKey { return k.pub }

// Sign implements crypto.Signer: an ASN.1 ECDSA signature of digest, made
// in the TPM.
func (k *Key) Sign(_ io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	alg, err := hashAlg(opts.HashFunc())
	if err != nil {
		return nil, err
	}
	h, err := k.tpm.load(k.blobs)
	if err != nil {
		return nil, err
	}
	defer k.tpm.flush(h.Handle)
	rsp, err := tpm2.Sign{
		KeyHandle:  h,
		Digest:     tpm2.TPM2BDigest{Buffer: digest},
		InScheme:   tpm2.TPMTSigScheme{Scheme: tpm2.TPMAlgECDSA, Details: tpm2.NewTPMUSigScheme(tpm2.TPMAlgECDSA, &tpm2.TPMSSchemeHash{HashAlg: alg})},
		Validation: tpm2.TPMTTKHashCheck{Tag: tpm2.TPMSTHashCheck, Hierarchy: tpm2.TPMRHNull},
	}.Execute(k.tpm)
	if err != nil {
		return nil, fmt.Errorf("sign in the TPM: %w", err)
	}
	sig, err := rsp.Signature.Signature.ECDSA()
	if err != nil {
		return nil, fmt.Errorf("TPM signature: %w", err)
	}
	return asn1.Marshal(struct{ R, S *big.Int }{new(big.Int).SetBytes(sig.SignatureR.Buffer), new(big.Int).SetBytes(sig.SignatureS.Buffer)})
}

func hashAlg(h crypto.Hash) (tpm2.TPMIAlgHash, error) {
	switch h {
	case crypto.SHA256:
		return tpm2.TPMAlgSHA256, nil
	case crypto.SHA384:
		return tpm2.TPMAlgSHA384, nil
	case crypto.SHA512:
		return tpm2.TPMAlgSHA512, nil
	}
	return 0, fmt.Errorf("the TPM key signs SHA-256, SHA-384 or SHA-512 digests, not %v", h)
}

// ReadPublic loads the key and returns its public key as the TPM reports
// it (TPM2_ReadPublic), not as the blob says.
func (t *TPM) ReadPublic(b Blobs) (*ecdsa.PublicKey, error) {
	h, err := t.load(b)
	if err != nil {
		return nil, err
	}
	defer t.flush(h.Handle)
	rsp, err := tpm2.ReadPublic{ObjectHandle: h.Handle}.Execute(t)
	if err != nil {
		return nil, fmt.Errorf("read public: %w", err)
	}
	area, err := rsp.OutPublic.Contents()
	if err != nil {
		return nil, fmt.Errorf("read public: %w", err)
	}
	return eccPublic(area)
}
