// Package secretscan searches bytes (a store's values, an etcd data
// directory, a snapshot) for secrets in clear, as tests that prove a store
// holds no key material do. A secret is looked for raw, in hex and in
// base64; and every base64 run found in the haystack is decoded and
// searched too, since JSON stores byte fields as base64.
package secretscan

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
)

// Needle is one secret to look for.
type Needle struct {
	Name  string
	Bytes []byte
}

// Hit is a needle found, and in which form.
type Hit struct {
	Name, Form, Where string
}

var b64run = regexp.MustCompile(`[A-Za-z0-9+/]{16,}={0,2}`)

// expand returns the haystack followed by every base64 run in it, decoded.
func expand(h []byte) []byte {
	out := bytes.Clone(h)
	for _, run := range b64run.FindAll(h, -1) {
		for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding} {
			if d, err := enc.DecodeString(string(run)); err == nil {
				out = append(append(out, 0), d...)
				out = append(append(out, 0), expand2(d)...)
				break
			}
		}
	}
	return out
}

// expand2 decodes one level further (a base64 field inside decoded JSON).
func expand2(h []byte) []byte {
	var out []byte
	for _, run := range b64run.FindAll(h, -1) {
		if d, err := base64.StdEncoding.DecodeString(string(run)); err == nil {
			out = append(append(out, 0), d...)
		}
	}
	return out
}

// Bytes searches one haystack for every needle.
func Bytes(where string, haystack []byte, needles []Needle) []Hit {
	h := expand(haystack)
	var hits []Hit
	for _, n := range needles {
		for _, f := range []struct {
			form string
			b    []byte
		}{
			{"raw", n.Bytes},
			{"hex", []byte(hex.EncodeToString(n.Bytes))},
			{"base64", []byte(base64.StdEncoding.EncodeToString(n.Bytes))},
		} {
			b := f.b
			if f.form == "base64" {
				// the last block depends on what follows in a longer encoding
				b = f.b[:max(len(f.b)/4*4-4, 4)]
			}
			if bytes.Contains(h, b) {
				hits = append(hits, Hit{Name: n.Name, Form: f.form, Where: where})
			}
		}
	}
	return hits
}

// Tree searches every regular file under root.
func Tree(root string, needles []Needle) ([]Hit, error) {
	var hits []Hit
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		hits = append(hits, Bytes(path, b, needles)...)
		return nil
	})
	return hits, err
}

// Windows makes needles of every size-byte run of secret, so that a part of
// it copied in clear (a seed inside a key file) is found too, whatever its
// alignment in an encoding.
func Windows(name string, secret []byte, size int) []Needle {
	if len(secret) <= size {
		return []Needle{{Name: name, Bytes: secret}}
	}
	out := make([]Needle, 0, len(secret)-size+1)
	for i := 0; i+size <= len(secret); i++ {
		out = append(out, Needle{Name: name, Bytes: secret[i : i+size]})
	}
	return out
}

// KeyDirNeedles are the secrets of a listener's key directory: the CA
// key's private scalar (not its whole DER, which holds the public key that
// certificates hold too) and the OPAQUE key file (AKE key pair, OPRF seed,
// fake-record seed), each in 24-byte windows.
func KeyDirNeedles(keyDir string) ([]Needle, error) {
	caPEM, err := os.ReadFile(filepath.Join(keyDir, "ca.key"))
	if err != nil {
		return nil, err
	}
	opaque, err := os.ReadFile(filepath.Join(keyDir, "opaque.key"))
	if err != nil {
		return nil, err
	}
	block, _ := pem.Decode(caPEM)
	if block == nil {
		return nil, errors.New("ca.key holds no PEM block")
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("ca.key: %w", err)
	}
	ec, ok := k.(*ecdsa.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("ca.key: %T, want an ECDSA key", k)
	}
	d, err := ec.Bytes()
	if err != nil {
		return nil, fmt.Errorf("ca.key: %w", err)
	}
	return append(Windows("ca.key private scalar", d, 24), Windows("opaque.key", opaque, 24)...), nil
}
