package listener_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/stratumjoin/stratum/internal/pake"
	"github.com/stratumjoin/stratum/internal/wire"
	"github.com/stratumjoin/stratum/listener/adminapi"
	"github.com/stratumjoin/stratum/listener/listenertest"
)

// pipeJoin runs the listener's join handler against r over net.Pipe: no
// QUIC, the exporter a fixed value on each end.
func pipeJoin(t *testing.T, l *listenertest.Listener, r rawJoin, agentExp, listenerExp []byte) (rawOutcome, wire.CloseCode, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a, b := net.Pipe()
	type served struct {
		code wire.CloseCode
		err  error
	}
	done := make(chan served, 1)
	go func() {
		code, err := l.Join(ctx, b, listenerExp)
		b.Close()
		done <- served{code, err}
	}()
	out, err := r.exchange(a, agentExp)
	if err != nil {
		t.Fatalf("agent side: %v", err)
	}
	a.Close()
	s := <-done
	return out, s.code, s.err
}

func TestJoinOverPipe(t *testing.T) {
	l := listenertest.Start(t, listenertest.Options{})
	exp := bytes.Repeat([]byte{0x5a}, wire.ExporterSize)

	sec, _ := mint(t, l, adminapi.MintCodeRequest{AutoApprove: true})
	out, code, err := pipeJoin(t, l, rawJoin{Secret: sec}, exp, exp)
	if err != nil || code != wire.CloseDone {
		t.Fatalf("listener ended the join with %v, %v", code, err)
	}
	if out.PAKEErr != nil || len(out.Results) != 1 {
		t.Fatalf("outcome %+v", out)
	}
	if res := out.Results[0]; res.Status != wire.StatusJoined || res.NodeID == "" || len(res.CertChain) == 0 {
		t.Fatalf("result %+v, want joined with a node id and a certificate", res)
	}

	// a malformed CSR is refused by name, after the proof
	sec, _ = mint(t, l, adminapi.MintCodeRequest{AutoApprove: true})
	out, code, err = pipeJoin(t, l, rawJoin{Secret: sec, CSR: []byte("not a csr")}, exp, exp)
	if code != wire.CloseDone {
		t.Fatalf("listener ended a bad CSR with %v, %v", code, err)
	}
	if len(out.Results) != 1 || out.Results[0].Status != wire.StatusRefused || out.Results[0].Code != wire.CodeBadCSR {
		t.Fatalf("bad CSR outcome %+v, want refused %s", out, wire.CodeBadCSR)
	}

	// ends that saw different connections (a relay terminating TLS on
	// both sides) cannot finish the login: the agent's check fails, and
	// the listener hears no proof
	sec, _ = mint(t, l, adminapi.MintCodeRequest{AutoApprove: true})
	other := bytes.Repeat([]byte{0xa5}, wire.ExporterSize)
	out, code, err = pipeJoin(t, l, rawJoin{Secret: sec}, other, exp)
	if !errors.Is(out.PAKEErr, pake.ErrNotAccepted) {
		t.Fatalf("agent's login over a relay: %v, want %v", out.PAKEErr, pake.ErrNotAccepted)
	}
	if code != wire.CloseNotProof || err == nil {
		t.Fatalf("listener ended a relayed join with %v, %v; want %v", code, err, wire.CloseNotProof)
	}
}
