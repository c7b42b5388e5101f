package agent_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/stratumjoin/stratum/agent"
	"github.com/stratumjoin/stratum/internal/wire"
	"github.com/stratumjoin/stratum/listener/adminapi"
	"github.com/stratumjoin/stratum/listener/listenertest"
	"github.com/stratumjoin/stratum/pki/authority"
)

// hangingListener accepts renewals with the real listener's certificate
// and never answers them.
func hangingListener(t *testing.T, l *listenertest.Listener) string {
	t.Helper()
	keys := authority.KeyDir{Path: filepath.Join(l.DataDir, "keys")}
	ca, err := keys.LoadCA()
	if err != nil {
		t.Fatal(err)
	}
	cert, err := keys.LoadListenerCert(ca, l.Settings().TrustDomain, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	ln, err := quic.ListenAddr("127.0.0.1:0", &tls.Config{
		MinVersion: tls.VersionTLS13, NextProtos: []string{wire.ALPNNode}, Certificates: []tls.Certificate{cert}, ClientAuth: tls.RequestClientCert,
	}, &quic.Config{KeepAlivePeriod: time.Second})
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
			go conn.AcceptStream(context.Background()) // and then nothing
		}
	}()
	return ln.Addr().(*net.UDPAddr).String()
}

// joinedTo joins a node to l, then points its node.json at endpoint.
func joinedTo(t *testing.T, l *listenertest.Listener, endpoint string) string {
	t.Helper()
	sec, _ := mintCode(t, l, adminapi.MintCodeRequest{AutoApprove: true})
	dir := filepath.Join(t.TempDir(), "state")
	j, err := agent.Join(context.Background(), agent.JoinConfig{StateDir: dir, Endpoint: l.Endpoint, Secret: sec})
	if err != nil {
		t.Fatal(err)
	}
	id := j.Identity
	id.Endpoint = endpoint
	b, _ := json.Marshal(id)
	if err := os.WriteFile(filepath.Join(dir, agent.NodeFile), b, 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestRenewDoesNotHang: a listener that takes the renewal and never
// answers costs Timeout, and a stop ends the wait at once; both count as
// the listener unreachable, which the service retries.
func TestRenewDoesNotHang(t *testing.T) {
	l := listenertest.Start(t, listenertest.Options{})
	dir := joinedTo(t, l, hangingListener(t, l))

	start := time.Now()
	err := renewWithin(t, context.Background(), agent.RenewConfig{StateDir: dir, Timeout: 300 * time.Millisecond})
	var unreachable *agent.UnreachableError
	if !errors.As(err, &unreachable) {
		t.Fatalf("renewal against a silent listener: %v", err)
	}
	t.Logf("silent listener: gave up after %s", time.Since(start).Round(time.Millisecond))

	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(300*time.Millisecond, cancel)
	if err := renewWithin(t, ctx, agent.RenewConfig{StateDir: dir}); err == nil {
		t.Fatal("renewal after its context ended reported success")
	}
}

// renewWithin fails the test if the renewal takes more than 5s.
func renewWithin(t *testing.T, ctx context.Context, cfg agent.RenewConfig) error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		_, err := agent.Renew(ctx, cfg)
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(5 * time.Second):
		t.Fatal("renewal still running after 5s")
		return nil
	}
}

// TestDialsProbeNoPathMTU: a join's and a renewal's connections live a
// few round trips, so neither asks its QUIC stack for path MTU probes (a
// padded datagram the listener must read, at the end of every join), and
// both wait DefaultDialTimeout for the handshake unless told otherwise.
func TestDialsProbeNoPathMTU(t *testing.T) {
	l := listenertest.Start(t, listenertest.Options{})
	var seen []*quic.Config
	dial := func(ctx context.Context, ep string, tc *tls.Config, qc *quic.Config) (*quic.Conn, error) {
		seen = append(seen, qc)
		return quic.DialAddr(ctx, ep, tc, qc)
	}
	sec, _ := mintCode(t, l, adminapi.MintCodeRequest{AutoApprove: true})
	dir := filepath.Join(t.TempDir(), "state")
	if _, err := agent.Join(context.Background(), agent.JoinConfig{StateDir: dir, Endpoint: l.Endpoint, Secret: sec, Dial: dial}); err != nil {
		t.Fatal(err)
	}
	if _, err := agent.Renew(context.Background(), agent.RenewConfig{StateDir: dir, Dial: dial}); err != nil {
		t.Fatal(err)
	}
	if len(seen) != 2 {
		t.Fatalf("%d dials, want the join's and the renewal's", len(seen))
	}
	for i, qc := range seen {
		if !qc.DisablePathMTUDiscovery || qc.HandshakeIdleTimeout != agent.DefaultDialTimeout {
			t.Errorf("dial %d: path MTU discovery off %v, handshake timeout %v; want off and %v", i, qc.DisablePathMTUDiscovery, qc.HandshakeIdleTimeout, agent.DefaultDialTimeout)
		}
	}
}
