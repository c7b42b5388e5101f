package agent

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/stratumjoin/stratum/internal/wire"
	"github.com/stratumjoin/stratum/pki"
)

// attemptsFile holds, per locator, the nonces of this machine's attempts
// whose end it has not seen: the listener died, the connection broke, or
// the store failed before the join was recorded. The next proof of the
// code reveals them, and the listener gives those attempts back. The
// file is a secret of sorts (a nonce is what claims a refund): 0600.
const attemptsFile = "attempts.json"

// maxKeptNonces bounds the nonces kept per code, as the Proof does.
const maxKeptNonces = wire.MaxRefunds

func (s State) readAttempts() (map[string][]string, error) {
	m := map[string][]string{}
	b, err := os.ReadFile(s.path(attemptsFile))
	if errors.Is(err, fs.ErrNotExist) {
		return m, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read attempt nonces: %w", err)
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("attempt nonces %s are corrupt (delete the file; the attempts it held stay counted): %w", s.path(attemptsFile), err)
	}
	return m, nil
}

// writeAttempts replaces attempts.json and, in the same batch and before
// it, the files of with: one directory sync for all.
func (s State) writeAttempts(m map[string][]string, with ...pki.File) error {
	if err := s.ensureDir(); err != nil {
		return err
	}
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	if err := pki.WriteFiles(s.Dir, append(with, pki.File{Name: attemptsFile, Data: b, Mode: 0o600})); err != nil {
		return fmt.Errorf("record attempt nonce: %w", err)
	}
	return nil
}

// newAttempt returns the nonce for an attempt with locator: the newest
// one whose end this machine has not seen (the listener may hold it
// counted; repeating its guess resumes it), or a fresh one recorded
// durably before anything is sent, so the attempt can be resumed or
// refunded even if this process dies mid-join. It also returns the
// commitment for Hello and the other unfinished nonces for Proof. A
// fresh key (not nil) is written with the nonce, or alone when the nonce
// is resumed.
func (s State) newAttempt(locator string, fresh *pki.File) (nonce []byte, commit []byte, earlier [][]byte, err error) {
	nonce, commit, earlier, save, err := s.prepareAttempt(locator, fresh, true)
	if err != nil {
		return nil, nil, nil, err
	}
	if err := save(); err != nil {
		return nil, nil, nil, err
	}
	return nonce, commit, earlier, nil
}

// prepareAttempt is newAttempt without the write: save makes the nonce
// (and the fresh key) durable, and must have returned nil before the
// Hello that carries the commitment leaves. Join runs it while the QUIC
// handshake is under way, which sends nothing of the join.
//
// counted says whether the listener counts the start before its KE2 (a
// join code's: cluster.CountsBeforeKE2). A token's or key's start is
// counted only when it ends unproven and nothing burns it, so a nonce lost
// to a crash costs at most one failed attempt in an operator's count: its
// fresh nonce stays in memory, and save writes only the fresh key.
func (s State) prepareAttempt(locator string, fresh *pki.File, counted bool) (nonce, commit []byte, earlier [][]byte, save func() error, err error) {
	var with []pki.File
	if fresh != nil {
		with = append(with, *fresh)
	}
	m, err := s.readAttempts()
	if err != nil {
		return nil, nil, nil, nil, err
	}
	var kept [][]byte
	for _, h := range m[locator] {
		if b, err := hex.DecodeString(h); err == nil && len(b) == wire.AttemptSize {
			kept = append(kept, b)
		}
	}
	save = func() error { return nil }
	if len(kept) > 0 {
		nonce, earlier = kept[len(kept)-1], kept[:len(kept)-1]
		if len(with) > 0 {
			save = func() error {
				if err := pki.WriteFiles(s.Dir, with); err != nil {
					return fmt.Errorf("write node key: %w", err)
				}
				return nil
			}
		}
	} else {
		nonce = make([]byte, wire.AttemptSize)
		if _, err := rand.Read(nonce); err != nil {
			return nil, nil, nil, nil, err
		}
		switch {
		case counted:
			m[locator] = []string{hex.EncodeToString(nonce)}
			save = func() error { return s.writeAttempts(m, with...) }
		case len(with) > 0:
			save = func() error {
				if err := pki.WriteFiles(s.Dir, with); err != nil {
					return fmt.Errorf("write node key: %w", err)
				}
				return nil
			}
		}
	}
	if len(earlier) > maxKeptNonces-1 {
		earlier = earlier[len(earlier)-(maxKeptNonces-1):]
	}
	c := sha256.Sum256(nonce)
	return nonce, c[:], earlier, save, nil
}

// finishAttempts forgets locator's nonces once a proof of the code was
// recorded (the listener answered it): its refunds are spent.
func (s State) finishAttempts(locator string) error {
	m, err := s.readAttempts()
	if err != nil {
		return err
	}
	if _, ok := m[locator]; !ok {
		return nil
	}
	delete(m, locator)
	return s.writeAttempts(m)
}

// dropAttempt forgets one nonce: its attempt failed for good (a wrong
// code), and no proof can ever refund it.
func (s State) dropAttempt(locator string, nonce []byte) error {
	m, err := s.readAttempts()
	if err != nil {
		return err
	}
	if _, ok := m[locator]; !ok {
		return nil // nothing recorded (a token's or key's start)
	}
	h := hex.EncodeToString(nonce)
	kept := m[locator][:0]
	for _, x := range m[locator] {
		if x != h {
			kept = append(kept, x)
		}
	}
	if len(kept) == 0 {
		delete(m, locator)
	} else {
		m[locator] = kept
	}
	return s.writeAttempts(m)
}
