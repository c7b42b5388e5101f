package listener_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"math/big"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/stratumjoin/stratum/agent"
	"github.com/stratumjoin/stratum/internal/wire"
	"github.com/stratumjoin/stratum/listener"
	"github.com/stratumjoin/stratum/listener/adminapi"
	"github.com/stratumjoin/stratum/listener/listenertest"
)

// relay terminates QUIC from agents and opens its own QUIC connection to
// the listener, copying every stream byte both ways: a machine-in-the-middle
// that sees everything but cannot make the two TLS exporters agree.
func startRelay(t *testing.T, upstream string) (addr string, forwarded *atomic.Int64) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), DNSNames: []string{"relay"}}
	der, _ := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	ln, err := quic.ListenAddr("127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}, NextProtos: []string{wire.ALPNJoin}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	forwarded = new(atomic.Int64)
	go func() {
		for {
			down, err := ln.Accept(context.Background())
			if err != nil {
				return
			}
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				up, err := dialJoin(ctx, upstream)
				if err != nil {
					down.CloseWithError(1, "")
					return
				}
				ds, err := down.AcceptStream(ctx)
				if err != nil {
					return
				}
				us, err := up.OpenStreamSync(ctx)
				if err != nil {
					return
				}
				done := make(chan struct{}, 2)
				cp := func(dst io.Writer, src io.Reader) {
					io.Copy(countingWriter{dst, forwarded}, src)
					done <- struct{}{}
				}
				go cp(us, ds)
				go cp(ds, us)
				<-done
				<-ctx.Done()
				up.CloseWithError(0, "")
				down.CloseWithError(0, "")
			}()
		}
	}()
	return ln.Addr().(*net.UDPAddr).String(), forwarded
}

func TestRelayFailsOnBothSides(t *testing.T) {
	var proofs atomic.Int32
	l := listenertest.Start(t, listenertest.Options{Config: listener.WithHooks(listener.Config{}, listener.Hooks{Proof: func(string) { proofs.Add(1) }})})
	sec, code := mint(t, l, adminapi.MintCodeRequest{AutoApprove: true})
	relay, forwarded := startRelay(t, l.Endpoint)

	dir := t.TempDir()
	_, err := agent.Join(context.Background(), agent.JoinConfig{StateDir: dir, Endpoint: relay, Secret: sec})
	if !errors.Is(err, agent.ErrNotAccepted) {
		t.Fatalf("join through a relay: %v, want ErrNotAccepted", err)
	}
	if forwarded.Load() == 0 {
		t.Fatal("the relay forwarded nothing: the test proves nothing")
	}
	if proofs.Load() != 0 {
		t.Fatal("a Proof reached the listener through the relay")
	}
	nodes, _ := l.Admin.Nodes(context.Background())
	c, _ := l.Admin.Code(context.Background(), code.ID)
	if len(nodes) != 0 || c.Uses != 0 || c.Registrations != 0 {
		t.Fatalf("something was issued: %d nodes, code %+v", len(nodes), c)
	}
	// the attempt stays counted: the listener never saw a proof
	if c.FailedAttempts != 1 {
		t.Fatalf("failedAttempts %d, want 1", c.FailedAttempts)
	}
	// and the same code still joins directly
	if _, _, err := join(t, l, sec, wire.Facts{}); err != nil {
		t.Fatalf("direct join after the relay: %v", err)
	}
}

// countingWriter counts bytes as they pass, so the test can check the
// relay really carried the exchange before either side finished.
type countingWriter struct {
	w io.Writer
	n *atomic.Int64
}

func (c countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n.Add(int64(n))
	return n, err
}
