package pki_test

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"strings"
	"testing"

	"github.com/stratumjoin/stratum/pki"
)

func TestParseCertsPEM(t *testing.T) {
	tests := []struct {
		file    string
		want    int    // certificates; 0 means an error
		wantMsg string // for errors
	}{
		{"root.pem", 1, ""},
		{"chain.pem", 2, ""},
		{"with-text.pem", 2, ""},
		{"garbage-block.pem", 0, "parse certificate 1"},
		{"public-key-block.pem", 0, `unexpected PEM block "PUBLIC KEY"`},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			certs, err := pki.ParseCertsPEM(readFile(t, "testdata/certs/"+tt.file))
			if tt.want == 0 {
				if err == nil || !strings.Contains(err.Error(), tt.wantMsg) {
					t.Fatalf("error = %v, want one saying %q", err, tt.wantMsg)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(certs) != tt.want {
				t.Errorf("%d certificates, want %d", len(certs), tt.want)
			}
		})
	}
	if _, err := pki.ParseCertsPEM([]byte("no pem here")); err == nil {
		t.Error("input without a block was accepted")
	}
}

func TestPrivateKeyPEMRoundTrip(t *testing.T) {
	p256, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	_, ed, _ := ed25519.GenerateKey(rand.Reader)
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []crypto.Signer{p256, ed, rsaKey} {
		data, err := pki.MarshalPrivateKeyPEM(key)
		if err != nil {
			t.Fatal(err)
		}
		if block, _ := pem.Decode(data); block == nil || block.Type != "PRIVATE KEY" {
			t.Errorf("%T not written as PKCS#8: %.30q", key, data)
		}
		back, err := pki.ParsePrivateKeyPEM(data)
		if err != nil {
			t.Fatal(err)
		}
		if !key.Public().(interface{ Equal(crypto.PublicKey) bool }).Equal(back.Public()) {
			t.Errorf("%T changed in the round trip", key)
		}
	}

	sec1, _ := x509.MarshalECPrivateKey(p256)
	if _, err := pki.ParsePrivateKeyPEM(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: sec1})); err != nil {
		t.Errorf("SEC 1 key refused: %v", err)
	}
	pkcs1 := x509.MarshalPKCS1PrivateKey(rsaKey)
	if _, err := pki.ParsePrivateKeyPEM(pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: pkcs1})); err != nil {
		t.Errorf("PKCS#1 key refused: %v", err)
	}
	one, _ := pki.MarshalPrivateKeyPEM(p256)
	if _, err := pki.ParsePrivateKeyPEM(append(one, one...)); err == nil {
		t.Error("two keys in one file accepted")
	}
	if _, err := pki.ParsePrivateKeyPEM(readFile(t, "testdata/certs/root.pem")); err == nil {
		t.Error("a certificate accepted as a key")
	}
}
