package pki

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
)

const (
	pemCertificate  = "CERTIFICATE"
	pemPrivateKey   = "PRIVATE KEY"
	pemECPrivateKey = "EC PRIVATE KEY"
	pemRSAKey       = "RSA PRIVATE KEY"
)

// EncodeCertsPEM encodes certs as consecutive "CERTIFICATE" blocks, in order.
func EncodeCertsPEM(certs []*x509.Certificate) []byte {
	var buf bytes.Buffer
	for _, c := range certs {
		// pem.Encode into a bytes.Buffer cannot fail.
		_ = pem.Encode(&buf, &pem.Block{Type: pemCertificate, Bytes: c.Raw})
	}
	return buf.Bytes()
}

// ParseCertsPEM parses every "CERTIFICATE" block in data, in order. Text
// between blocks is ignored, as PEM allows; a block of any other type (a
// private key pasted into a bundle, say) is an error, and so is input
// without a single certificate.
func ParseCertsPEM(data []byte) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	rest := data
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type != pemCertificate {
			return nil, fmt.Errorf("parse certificates: unexpected PEM block %q", block.Type)
		}
		if len(block.Headers) != 0 {
			return nil, errors.New("parse certificates: PEM headers are not allowed")
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("parse certificate %d: %w", len(certs)+1, err)
		}
		certs = append(certs, c)
	}
	if len(certs) == 0 {
		return nil, errors.New("parse certificates: no CERTIFICATE block found")
	}
	return certs, nil
}

// MarshalPrivateKeyPEM encodes key as one PKCS#8 "PRIVATE KEY" block.
func MarshalPrivateKeyPEM(key crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("marshal private key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: pemPrivateKey, Bytes: der}), nil
}

// ParsePrivateKeyPEM parses the single private key block in data. It reads
// PKCS#8 ("PRIVATE KEY"), which is what this package writes, and also the
// SEC 1 ("EC PRIVATE KEY") and PKCS#1 ("RSA PRIVATE KEY") forms that an
// existing CA imported with ImportCA may come in. Errors never quote the
// key material.
func ParsePrivateKeyPEM(data []byte) (crypto.Signer, error) {
	block, rest := pem.Decode(data)
	if block == nil {
		return nil, errors.New("parse private key: no PEM block found")
	}
	if next, _ := pem.Decode(rest); next != nil {
		return nil, errors.New("parse private key: more than one PEM block")
	}
	var (
		key any
		err error
	)
	switch block.Type {
	case pemPrivateKey:
		key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	case pemECPrivateKey:
		key, err = x509.ParseECPrivateKey(block.Bytes)
	case pemRSAKey:
		key, err = x509.ParsePKCS1PrivateKey(block.Bytes)
	default:
		return nil, fmt.Errorf("parse private key: unexpected PEM block %q", block.Type)
	}
	if err != nil {
		// The x509 parse errors describe structure, never key bytes.
		return nil, fmt.Errorf("parse private key: %w", err)
	}
	switch k := key.(type) {
	case *ecdsa.PrivateKey:
		return k, nil
	case ed25519.PrivateKey:
		return k, nil
	case *rsa.PrivateKey:
		return k, nil
	default:
		return nil, fmt.Errorf("parse private key: unsupported key type %T", key)
	}
}
