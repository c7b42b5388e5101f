package etcdtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TLSFiles are PEM files for an etcd served over TLS: a CA, a server
// certificate for 127.0.0.1 and localhost, a client certificate from the
// same CA, and a "rogue" client certificate from a CA etcd does not trust.
type TLSFiles struct {
	CA                    string
	ServerCert, ServerKey string
	ClientCert, ClientKey string
	RogueCert, RogueKey   string
}

// WriteTLSFiles makes the certificates and keys (keys 0600) in dir.
func WriteTLSFiles(t testing.TB, dir string) TLSFiles {
	t.Helper()
	ca, caKey := newTLSCert(t, "etcd test ca", nil, nil, true)
	rogue, rogueKey := newTLSCert(t, "rogue ca", nil, nil, true)
	srv, srvKey := newTLSCert(t, "etcd", ca, caKey, false)
	cli, cliKey := newTLSCert(t, "stratum", ca, caKey, false)
	rc, rcKey := newTLSCert(t, "stratum", rogue, rogueKey, false)
	f := TLSFiles{
		CA:         writeTLSPEM(t, dir, "ca.crt", "CERTIFICATE", ca.Raw),
		ServerCert: writeTLSPEM(t, dir, "server.crt", "CERTIFICATE", srv.Raw),
		ServerKey:  writeTLSKey(t, dir, "server.key", srvKey),
		ClientCert: writeTLSPEM(t, dir, "client.crt", "CERTIFICATE", cli.Raw),
		ClientKey:  writeTLSKey(t, dir, "client.key", cliKey),
		RogueCert:  writeTLSPEM(t, dir, "rogue.crt", "CERTIFICATE", rc.Raw),
		RogueKey:   writeTLSKey(t, dir, "rogue.key", rcKey),
	}
	return f
}

func newTLSCert(t testing.TB, cn string, parent *x509.Certificate, parentKey *ecdsa.PrivateKey, isCA bool) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 64))
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
	}
	if isCA {
		tmpl.IsCA, tmpl.BasicConstraintsValid, tmpl.KeyUsage = true, true, x509.KeyUsageCertSign
		parent, parentKey = tmpl, key
	} else {
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
		tmpl.DNSNames = []string{"localhost"}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, key.Public(), parentKey)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c, key
}

func writeTLSPEM(t testing.TB, dir, name, typ string, der []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func writeTLSKey(t testing.TB, dir, name string, key *ecdsa.PrivateKey) string {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return writeTLSPEM(t, dir, name, "PRIVATE KEY", der)
}
