package listener_test

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"regexp"
	"testing"

	"github.com/stratumjoin/stratum/agent"
	"github.com/stratumjoin/stratum/internal/wire"
	"github.com/stratumjoin/stratum/listener/adminapi"
	"github.com/stratumjoin/stratum/listener/adminclient"
	"github.com/stratumjoin/stratum/listener/listenertest"
)

var sixDigits = regexp.MustCompile(`^[0-9]{6}$`)

// pendingOf reads the SAS the agent in dir printed for its pending join.
func pendingOf(t *testing.T, dir string) agent.Pending {
	t.Helper()
	p, ok, err := agent.State{Dir: dir}.Pending()
	if err != nil || !ok {
		t.Fatalf("no pending.json in %s: %v", dir, err)
	}
	return p
}

// TestSASCannotBeTakenOver: machine A holds a pending join with a batch
// code. A relay, a second machine racing the same code, and a CSR that
// claims A's key without its signature all fail to give A's join their
// session, so the SAS listed for A stays the digits A prints; an approval
// with any other digits is refused and A stays pending; A's own digits
// approve it.
func TestSASCannotBeTakenOver(t *testing.T) {
	l := listenertest.Start(t, listenertest.Options{})
	sec, _ := mint(t, l, adminapi.MintCodeRequest{}) // defaults: reusable, held for approval
	ctx := context.Background()

	dirA := t.TempDir()
	a := startJoin(t, l, sec, dirA, wire.Facts{Hostname: "a", ProductUUID: "4c4c4544-0000-0000-0000-00000000000a"})
	joinA := a.waitPending(t)
	sasA := pendingOf(t, dirA).SAS
	if !sixDigits.MatchString(sasA) || findJoin(t, l, joinA).SAS != sasA {
		t.Fatalf("agent SAS %q, listed %q", sasA, findJoin(t, l, joinA).SAS)
	}

	// a relay terminating TLS on both sides gets no session at all
	relay, forwarded := startRelay(t, l.Endpoint)
	if _, err := agent.Join(ctx, agent.JoinConfig{StateDir: t.TempDir(), Endpoint: relay, Secret: sec}); !errors.Is(err, agent.ErrNotAccepted) {
		t.Fatalf("join through a relay: %v", err)
	}
	if forwarded.Load() == 0 {
		t.Fatal("the relay forwarded nothing")
	}

	// a second machine with the same code gets its own join and digits
	dirB := t.TempDir()
	b := startJoin(t, l, sec, dirB, wire.Facts{Hostname: "b", ProductUUID: "4c4c4544-0000-0000-0000-00000000000b"})
	joinB := b.waitPending(t)
	sasB := pendingOf(t, dirB).SAS
	if joinB == joinA {
		t.Fatal("the second machine resumed the first machine's join")
	}
	if sasB == sasA { // 1 in a million
		t.Fatalf("both machines print %s", sasA)
	}

	// a CSR with A's public key but no valid signature by it is refused
	keyA, err := agent.State{Dir: dirA}.Key()
	if err != nil {
		t.Fatal(err)
	}
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, keyA)
	if err != nil {
		t.Fatal(err)
	}
	csr[len(csr)-1] ^= 0x01 // the signature's last byte
	if _, err := x509.ParseCertificateRequest(csr); err != nil {
		t.Fatalf("the forged CSR must still parse: %v", err)
	}
	out, err := rawJoin{Secret: sec, CSR: csr}.run(ctx, l.Endpoint)
	if err != nil || out.PAKEErr != nil || len(out.Results) != 1 || out.Results[0].Code != wire.CodeBadCSR {
		t.Fatalf("forged CSR for A's key: %+v %v", out.Results, err)
	}

	if got := findJoin(t, l, joinA); got.SAS != sasA || !got.IsPending() {
		t.Fatalf("A's join after the attempts: sas %q state %s, want %q pending", got.SAS, got.State, sasA)
	}
	joins, _ := l.Admin.Joins(ctx)
	if len(joins) != 2 {
		t.Fatalf("%d joins, want A's and B's", len(joins))
	}

	// approving A with B's digits is refused; A stays pending
	_, err = l.Admin.DecideJoin(ctx, joinA, true, sasB)
	var pe *adminclient.ProblemError
	if !errors.As(err, &pe) || pe.Code != adminapi.CodeApprovalRefused || pe.Status != 409 || len(pe.Errors) == 0 || pe.Errors[0].Field != "sas" {
		t.Fatalf("approve with another machine's SAS: %v", err)
	}
	if j := findJoin(t, l, joinA); !j.IsPending() {
		t.Fatal("a refused approval decided the join")
	}
	if _, err := l.Admin.DecideJoin(ctx, joinA, true, sasA[:3]+" "+sasA[3:]); err != nil {
		t.Fatalf("approve with A's own SAS: %v", err)
	}
	if j, err := a.wait(t); err != nil || j == nil {
		t.Fatalf("A after approval: %v", err)
	}
	if _, ok, _ := (agent.State{Dir: dirA}).Pending(); ok {
		t.Error("pending.json stays after the join")
	}
	decide(t, l, joinB, false)
	var refused *agent.RefusedError
	if _, err := b.wait(t); !errors.As(err, &refused) || refused.Code != wire.CodeApprovalRefused {
		t.Fatalf("B after refusal: %v", err)
	}
}
