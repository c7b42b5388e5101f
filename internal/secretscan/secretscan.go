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
	"encoding/binary"
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
	h := expand(squeezeZeros(haystack))
	type form struct {
		needle, form string
		b            []byte
	}
	var short []form
	byPrefix := map[uint64][]form{}
	for _, n := range needles {
		enc := base64.StdEncoding.EncodeToString(n.Bytes)
		for _, f := range []form{
			{n.Name, "raw", n.Bytes},
			{n.Name, "hex", []byte(hex.EncodeToString(n.Bytes))},
			// the last block depends on what follows in a longer encoding
			{n.Name, "base64", []byte(enc[:max(len(enc)/4*4-4, 4)])},
		} {
			if len(f.b) < 8 {
				short = append(short, f)
				continue
			}
			k := binary.LittleEndian.Uint64(f.b)
			byPrefix[k] = append(byPrefix[k], f)
		}
	}
	found := map[[2]string]bool{}
	var hits []Hit
	add := func(f form) {
		if k := [2]string{f.needle, f.form}; !found[k] {
			found[k] = true
			hits = append(hits, Hit{Name: f.needle, Form: f.form, Where: where})
		}
	}
	for i := 0; i+8 <= len(h); i++ {
		for _, f := range byPrefix[binary.LittleEndian.Uint64(h[i:])] {
			if bytes.HasPrefix(h[i:], f.b) {
				add(f)
			}
		}
	}
	for _, f := range short {
		if bytes.Contains(h, f.b) {
			add(f)
		}
	}
	return hits
}

// squeezeZeros shortens runs of more than 64 zero bytes (preallocated log
// segments, free pages) to 64: no needle (at most 64 bytes once encoded
// here, as Windows makes them) can tell, and the search is faster.
func squeezeZeros(b []byte) []byte {
	const keep = 64
	out := make([]byte, 0, len(b)/4)
	for i := 0; i < len(b); {
		if b[i] != 0 {
			out = append(out, b[i])
			i++
			continue
		}
		j := i
		for j < len(b) && b[j] == 0 {
			j++
		}
		out = append(out, make([]byte, min(j-i, keep))...)
		i = j
	}
	return out
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
