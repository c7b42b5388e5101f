package agent_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"path/filepath"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/stratumjoin/stratum/agent"
	"github.com/stratumjoin/stratum/internal/joincode"
	"github.com/stratumjoin/stratum/internal/wire"
)

// fakeRefuser is a QUIC join endpoint that answers every Hello with res,
// as a listener that never proves itself could.
func fakeRefuser(t *testing.T, res wire.Result) string {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "fake"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := quic.ListenAddr("127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}, NextProtos: []string{wire.ALPNJoin}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept(context.Background())
			if err != nil {
				return
			}
			go func() {
				str, err := conn.AcceptStream(context.Background())
				if err != nil {
					return
				}
				var h wire.Hello
				if wire.Read(str, &h) == nil {
					_ = wire.Write(str, &res)
				}
				str.Close()
				<-conn.Context().Done()
			}()
		}
	}()
	return ln.Addr().String()
}

// TestRefusalBeforeThePAKEIsNeverFinal: before the listener proves it
// holds the code's record, the agent takes only JOIN_RATE_LIMITED from
// it, with its wait capped; any other refusal is a transient failure, so
// a fake listener cannot make the agent give its code up.
func TestRefusalBeforeThePAKEIsNeverFinal(t *testing.T) {
	sec, err := joincode.NewCode("4F")
	if err != nil {
		t.Fatal(err)
	}
	join := func(endpoint string) error {
		_, err := agent.Join(context.Background(), agent.JoinConfig{StateDir: filepath.Join(t.TempDir(), "s"), Endpoint: endpoint, Secret: sec})
		return err
	}
	err = join(fakeRefuser(t, wire.Result{Status: wire.StatusRefused, Code: wire.CodeRevoked, Message: "burned"}))
	var unreachable *agent.UnreachableError
	var refused *agent.RefusedError
	if !errors.As(err, &unreachable) || errors.As(err, &refused) {
		t.Fatalf("a refusal before the PAKE: %v, want a transient failure", err)
	}
	err = join(fakeRefuser(t, wire.Result{Status: wire.StatusRefused, Code: wire.CodeRateLimited, Message: "later", RetryAfter: 86400}))
	if !errors.As(err, &refused) || !refused.Retryable() || refused.RetryAfter != 10*time.Minute {
		t.Fatalf("JOIN_RATE_LIMITED asking for a day: %v (wait %v), want a retryable refusal capped at 10m", err, refused)
	}
}
