package agent

import (
	"crypto"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"

	"github.com/stratumjoin/stratum/internal/tpm"
	"github.com/stratumjoin/stratum/internal/wire"
	"github.com/stratumjoin/stratum/pki"
)

// The blobs of a node key held in a TPM (docs/tpm.md): its public area
// and its private area wrapped by the TPM's storage root key, useless
// anywhere else. Both are 0600 all the same.
const (
	TPMPublicFile  = "node-key.tpm.pub"
	TPMPrivateFile = "node-key.tpm.priv"
)

// HasTPMKey reports whether the node key lives in a TPM.
func (s State) HasTPMKey() bool {
	_, err := os.Stat(s.path(TPMPrivateFile))
	return err == nil
}

// TPMBlobs reads the stored blobs of the TPM-held node key.
func (s State) TPMBlobs() (tpm.Blobs, error) {
	pub, err := os.ReadFile(s.path(TPMPublicFile))
	if err != nil {
		return tpm.Blobs{}, fmt.Errorf("read TPM key blob: %w", err)
	}
	priv, err := os.ReadFile(s.path(TPMPrivateFile))
	if err != nil {
		return tpm.Blobs{}, fmt.Errorf("read TPM key blob: %w", err)
	}
	return tpm.Blobs{Public: pub, Private: priv}, nil
}

// tpmKey opens the TPM at locator and loads the node key from its blobs,
// creating the key in the TPM on first use. The caller closes the TPM.
func (s State) tpmKey(locator string) (*tpm.TPM, *tpm.Key, error) {
	if err := s.ensureDir(); err != nil {
		return nil, nil, err
	}
	if _, err := os.Stat(s.path(KeyFile)); err == nil {
		return nil, nil, fmt.Errorf("this node's key is a file (%s): a TPM cannot take it over; use a fresh state directory to join with the TPM", KeyFile)
	}
	tp, err := tpm.Open(locator)
	if err != nil {
		return nil, nil, err
	}
	blobs, err := s.TPMBlobs()
	if errors.Is(err, fs.ErrNotExist) {
		if blobs, err = tp.CreateKey(); err == nil {
			err = pki.WriteFiles(s.Dir, []pki.File{
				{Name: TPMPublicFile, Data: blobs.Public, Mode: 0o600},
				{Name: TPMPrivateFile, Data: blobs.Private, Mode: 0o600},
			})
		}
	}
	if err != nil {
		tp.Close()
		return nil, nil, err
	}
	key, err := tp.LoadKey(blobs)
	if err != nil {
		tp.Close()
		return nil, nil, err
	}
	return tp, key, nil
}

// nodeKey is the node's signer: in the TPM at locator when one is given or
// the key lives in one, else the key file. A key file made now comes back
// as fresh, not yet written: the caller makes it durable before the key
// is used. close releases the TPM.
func (s State) nodeKey(locator string) (key crypto.Signer, fresh *pki.File, tp *tpm.TPM, err error) {
	if locator == "" && s.HasTPMKey() {
		return nil, nil, nil, errors.New("this node's key lives in a TPM, and no TPM was given (--tpm or --tpm-sim)")
	}
	if locator == "" {
		key, fresh, err = s.loadKey()
		return key, fresh, nil, err
	}
	tp, k, err := s.tpmKey(locator)
	if err != nil {
		return nil, nil, nil, err
	}
	return k, nil, tp, nil
}

// readResult reads the Result that follows the Proof. With att, the
// listener first sends a TPM challenge (unless it refuses at once): the
// TPM answers it, and the Result follows.
func readResult(str io.ReadWriter, att *tpm.Attestation, res *wire.Result) error {
	typ, body, err := readFrame(str)
	if err != nil {
		return err
	}
	if att != nil && typ == wire.TypeTPMChallenge {
		var ch wire.TPMChallenge
		if err := wire.Decode(typ, body, &ch); err != nil {
			return fmt.Errorf("listener sent a malformed TPM challenge: %w", err)
		}
		ans, err := att.Answer(tpm.Challenge{Credential: ch.Credential, Secret: ch.Secret, Nonce: ch.Nonce})
		if err != nil {
			return fmt.Errorf("TPM attestation: %w", err)
		}
		if err := wire.Write(str, &wire.TPMAnswer{Secret: ans.Secret, CertifyInfo: ans.CertifyInfo, Signature: ans.Signature}); err != nil {
			return streamError(err)
		}
		if typ, body, err = readFrame(str); err != nil {
			return err
		}
	}
	if err := wire.Decode(typ, body, res); err != nil {
		return fmt.Errorf("listener sent a malformed result: %w", err)
	}
	return nil
}

func readFrame(str io.Reader) (byte, []byte, error) {
	typ, body, err := wire.ReadFrame(str)
	if errors.Is(err, wire.ErrFrame) {
		return 0, nil, fmt.Errorf("listener sent a malformed result: %w", err)
	}
	if err != nil {
		return 0, nil, streamError(err)
	}
	return typ, body, nil
}

func claimOf(c tpm.Claim) *wire.TPMClaim {
	return &wire.TPMClaim{EKPublic: c.EKPublic, EKCert: c.EKCert, AKPublic: c.AKPublic, KeyPublic: c.KeyPublic}
}
