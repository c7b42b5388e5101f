package listener_test

import (
	"context"
	"crypto/tls"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/stratumjoin/stratum/agent"
	"github.com/stratumjoin/stratum/internal/wire"
	"github.com/stratumjoin/stratum/listener/adminapi"
	"github.com/stratumjoin/stratum/listener/listenertest"
)

// udpTap forwards datagrams between one agent and the listener through a
// socket of its own and records the size of each datagram the listener
// sends: what crosses the wire, as a packet capture would see it.
type udpTap struct {
	mu    sync.Mutex
	sizes []int
}

func startUDPTap(t *testing.T, upstream string) (string, *udpTap) {
	t.Helper()
	down, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	upAddr, err := net.ResolveUDPAddr("udp", upstream)
	if err != nil {
		t.Fatal(err)
	}
	up, err := net.DialUDP("udp", nil, upAddr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { down.Close(); up.Close() })
	tap := &udpTap{}
	var agentAddr atomic.Pointer[net.UDPAddr] // the one agent's, once it has sent
	go func() {
		buf := make([]byte, 65536)
		for {
			n, from, err := down.ReadFromUDP(buf)
			if err != nil {
				return
			}
			agentAddr.Store(from)
			up.Write(buf[:n])
		}
	}()
	go func() {
		buf := make([]byte, 65536)
		for {
			n, err := up.Read(buf)
			if err != nil {
				return
			}
			tap.mu.Lock()
			tap.sizes = append(tap.sizes, n)
			tap.mu.Unlock()
			if to := agentAddr.Load(); to != nil {
				down.WriteToUDP(buf[:n], to)
			}
		}
	}()
	return down.LocalAddr().String(), tap
}

// TestListenerSendsNoPathMTUProbes: a join's connection lives for a few
// round trips, too short for a larger path MTU to pay for the probes that
// find it (each a padded packet the agent must acknowledge), so the
// listener sends nothing larger than QUIC's initial 1,280-byte datagrams.
func TestListenerSendsNoPathMTUProbes(t *testing.T) {
	l := listenertest.Start(t, listenertest.Options{})
	addr, tap := startUDPTap(t, l.Endpoint)
	for i := range 3 {
		sec, _ := mint(t, l, adminapi.MintCodeRequest{AutoApprove: true})
		if _, err := agent.Join(context.Background(), agent.JoinConfig{StateDir: filepath.Join(t.TempDir(), "agent"), Endpoint: addr, Secret: sec}); err != nil {
			t.Fatalf("join %d: %v", i, err)
		}
	}
	tap.mu.Lock()
	defer tap.mu.Unlock()
	if len(tap.sizes) == 0 {
		t.Fatal("no datagram from the listener crossed the tap")
	}
	for _, n := range tap.sizes {
		if n > 1280 {
			t.Fatalf("the listener sent a %d-byte datagram (sizes %v): a path MTU probe", n, tap.sizes)
		}
	}
}

// TestListenerIssuesNoSessionTickets: no agent resumes a TLS session (each
// join and renewal is a fresh handshake its PAKE or node certificate
// authenticates), so a ticket would be sealed for nothing, and for a
// renewal it would carry the node's certificate chain. A client that keeps
// tickets comes back to a full handshake.
func TestListenerIssuesNoSessionTickets(t *testing.T) {
	l := listenertest.Start(t, listenertest.Options{})
	sec, _ := mint(t, l, adminapi.MintCodeRequest{AutoApprove: true})
	cache := tls.NewLRUClientSessionCache(4)
	dial := func() *quic.Conn {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		conn, err := quic.DialAddr(ctx, l.Endpoint, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{wire.ALPNJoin}, MinVersion: tls.VersionTLS13, ClientSessionCache: cache}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return conn
	}
	first := dial()
	str, err := first.OpenStreamSync(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// the Challenge comes after the handshake's last flight, where a
	// ticket would have been
	if out, err := (rawJoin{Secret: sec, StopAfterChallenge: true}).exchange(str, exporterOf(t, first)); err != nil || len(out.Challenge.KE2) == 0 {
		t.Fatalf("first exchange: %+v, %v", out, err)
	}
	first.CloseWithError(0, "")
	second := dial()
	defer second.CloseWithError(0, "")
	if second.ConnectionState().TLS.DidResume {
		t.Fatal("the listener resumed a TLS session from a ticket it issued")
	}
}

func exporterOf(t *testing.T, conn *quic.Conn) []byte {
	t.Helper()
	exp, err := wire.Exporter(conn.ConnectionState().TLS)
	if err != nil {
		t.Fatal(err)
	}
	return exp
}

// TestOnlyRenewalsAreAskedForACertificate: a join presents no client
// certificate, so its handshake carries no CertificateRequest; a client
// offering the renewal ALPN is asked for its node certificate.
func TestOnlyRenewalsAreAskedForACertificate(t *testing.T) {
	l := listenertest.Start(t, listenertest.Options{})
	for _, tc := range []struct {
		alpn  string
		asked bool
	}{
		{wire.ALPNJoin, false},
		{wire.ALPNNode, true},
	} {
		asked := false
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		conn, err := quic.DialAddr(ctx, l.Endpoint, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{tc.alpn}, MinVersion: tls.VersionTLS13,
			GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
				asked = true
				return &tls.Certificate{}, nil
			}}, nil)
		cancel()
		if err != nil {
			t.Fatalf("%s: %v", tc.alpn, err)
		}
		if got := conn.ConnectionState().TLS.NegotiatedProtocol; got != tc.alpn {
			t.Errorf("offered %s, negotiated %q", tc.alpn, got)
		}
		conn.CloseWithError(0, "")
		if asked != tc.asked {
			t.Errorf("%s: asked for a client certificate %v, want %v", tc.alpn, asked, tc.asked)
		}
	}
}
