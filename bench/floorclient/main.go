// Command floorclient is the floor of a one-shot token join for
// BenchmarkOneShotJoin (bench/oneshot_test.go): the unavoidable work of
// `stratum-agent join` with a default token, from process start to exit.
// It is a binary of its own, not the re-executed test binary, so that the
// floor does not pay the package initialisation of everything the bench
// package links (about 10 ms of a process start here).
//
// Usage: floorclient ADDR STATE; ADDR "start" exits at once.
package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/stratumjoin/stratum/internal/pake"
	"github.com/stratumjoin/stratum/internal/wire"
	"github.com/stratumjoin/stratum/pki"
)

// The agent's file names (agent.KeyFile, agent.CertFile, agent.CAFile),
// not imported: the agent package would bring its dependencies' start-up
// cost with it.
const (
	keyFile  = "node.key"
	certFile = "node.crt"
	caFile   = "ca.pem"
)

func main() {
	if len(os.Args) < 2 || os.Args[1] == "start" {
		return
	}
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: floorclient ADDR STATE")
		os.Exit(2)
	}
	if err := floorOneShot(os.Args[1], os.Args[2]); err != nil {
		fmt.Fprintln(os.Stderr, "floor client:", err)
		os.Exit(1)
	}
}

// floorOneShot makes a node key, runs one QUIC handshake and one OPAQUE
// login with the identity KSF (KE1, then KE3 from the KE2), checks the
// server's certificate and the issued one against the root the PAKE
// proved, sends the CSR, and writes key, certificate and CA durably in one
// batch with one directory sync.
func floorOneShot(addr, state string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	conn, err := quic.DialAddr(ctx, addr, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{wire.ALPNJoin}, MinVersion: tls.VersionTLS13}, nil)
	if err != nil {
		return err
	}
	defer conn.CloseWithError(0, "")
	cs := conn.ConnectionState()
	exp, err := wire.Exporter(cs.TLS)
	if err != nil {
		return err
	}
	str, err := conn.OpenStreamSync(ctx)
	if err != nil {
		return err
	}
	login, ke1, err := pake.Start(wire.BindingContext(exp), "FL", []byte("FL000000000"))
	if err != nil {
		return err
	}
	if err := wire.Write(str, &wire.Hello{Version: wire.Version, Locator: "FL", KE1: ke1}); err != nil {
		return err
	}
	var ch wire.Challenge
	if err := wire.Read(str, &ch); err != nil {
		return err
	}
	if len(ch.CAChain) == 0 {
		return errors.New("no CA chain")
	}
	root, err := x509.ParseCertificate(ch.CAChain[len(ch.CAChain)-1])
	if err != nil {
		return err
	}
	fp := sha256.Sum256(root.Raw)
	ke3, _, err := login.Finish(ch.KE2, fp[:], ch.KSF)
	if err != nil {
		return err
	}
	roots := x509.NewCertPool()
	roots.AddCert(root)
	if _, err := cs.TLS.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		return err
	}
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		return err
	}
	if err := wire.Write(str, &wire.Proof{KE3: ke3, CSR: csr}); err != nil {
		return err
	}
	var res wire.Result
	if err := wire.Read(str, &res); err != nil {
		return err
	}
	if res.Status != wire.StatusJoined || len(res.CertChain) == 0 {
		return fmt.Errorf("result %v", res.Status)
	}
	leaf, err := x509.ParseCertificate(res.CertChain[0])
	if err != nil {
		return err
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return err
	}
	keyPEM, err := pki.MarshalPrivateKeyPEM(key)
	if err != nil {
		return err
	}
	return pki.WriteFiles(state, []pki.File{
		{Name: keyFile, Data: keyPEM, Mode: 0o600},
		{Name: certFile, Data: pki.EncodeCertsPEM([]*x509.Certificate{leaf}), Mode: 0o644},
		{Name: caFile, Data: pki.EncodeCertsPEM([]*x509.Certificate{root}), Mode: 0o644},
	})
}
