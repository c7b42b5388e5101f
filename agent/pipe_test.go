package agent_test

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"errors"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/stratumjoin/stratum/agent"
	"github.com/stratumjoin/stratum/internal/joincode"
	"github.com/stratumjoin/stratum/internal/wire"
	"github.com/stratumjoin/stratum/listener/adminapi"
	"github.com/stratumjoin/stratum/listener/listenertest"
	"github.com/stratumjoin/stratum/pki"
	"github.com/stratumjoin/stratum/pki/authority"
)

// pipeExchange runs the agent's join logic against the listener's join
// handler over net.Pipe: no QUIC, the exporter a fixed value on both
// ends, peer standing in for the listener's QUIC certificate.
func pipeExchange(t *testing.T, l *listenertest.Listener, sec joincode.Secret, peer [][]byte) (*agent.Joined, crypto.Signer, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	exp := bytes.Repeat([]byte{0x3c}, wire.ExporterSize)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	a, b := net.Pipe()
	done := make(chan error, 1)
	go func() {
		_, err := l.Join(ctx, b, exp)
		b.Close()
		done <- err
	}()
	j, err := agent.Exchange(ctx, a, exp, peer, key, agent.JoinConfig{StateDir: filepath.Join(t.TempDir(), "state"), Endpoint: l.Endpoint, Secret: sec})
	a.Close()
	<-done
	return j, key, err
}

// listenerCert is a QUIC certificate for the listener, issued by ca.
func listenerCert(t *testing.T, ca *authority.CA, trustDomain string) [][]byte {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := ca.IssueListener(k.Public(), trustDomain, []string{"localhost"}, nil, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return [][]byte{der}
}

func TestExchangeOverPipe(t *testing.T) {
	l := listenertest.Start(t, listenertest.Options{})
	ca, _ := l.CA()
	td := l.Settings().TrustDomain
	peer := listenerCert(t, ca, td)

	sec, _ := l.MintCode(t, adminapi.MintCodeRequest{AutoApprove: true})
	j, key, err := pipeExchange(t, l, sec, peer)
	if err != nil {
		t.Fatalf("join over a pipe: %v", err)
	}
	if j.Identity.NodeID == "" || len(j.Chain) == 0 {
		t.Fatalf("joined %+v, want a node id and a chain", j.Identity)
	}
	if pub, ok := j.Chain[0].PublicKey.(*ecdsa.PublicKey); !ok || !pub.Equal(key.Public()) {
		t.Fatal("the node certificate does not certify the node key")
	}
	if _, err := pki.VerifyNodeChain([][]byte{j.Chain[0].Raw}, l.Roots(), td, time.Now()); err != nil {
		t.Fatalf("node certificate: %v", err)
	}

	// a wrong code: the agent's check of the listener's answer fails
	wrong, err := joincode.NewCode(sec.Locator)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := pipeExchange(t, l, wrong, peer); !errors.Is(err, agent.ErrNotAccepted) {
		t.Fatalf("wrong code: %v, want %v", err, agent.ErrNotAccepted)
	}

	// a QUIC certificate from another CA: the login succeeds, the agent
	// refuses the listener before it sends its CSR
	other, err := authority.NewRootCA(td, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	sec, _ = l.MintCode(t, adminapi.MintCodeRequest{AutoApprove: true})
	if _, _, err := pipeExchange(t, l, sec, listenerCert(t, other, td)); !errors.Is(err, agent.ErrNotAuthentic) {
		t.Fatalf("foreign listener certificate: %v, want %v", err, agent.ErrNotAuthentic)
	}
}
