package listener_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stratumjoin/stratum/agent"
	"github.com/stratumjoin/stratum/internal/cluster"
	"github.com/stratumjoin/stratum/internal/store"
	"github.com/stratumjoin/stratum/internal/wire"
	"github.com/stratumjoin/stratum/listener"
	"github.com/stratumjoin/stratum/listener/adminapi"
	"github.com/stratumjoin/stratum/listener/listenertest"
)

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestMetricsAndHealth: after a join, a renewal, eleven wrong codes (the
// last burns the code) and a refusal, /metrics counts each under its
// label; failed proofs are events with the remote address, as is the
// join; /readyz turns 503 once the store is gone while /healthz stays 200.
func TestMetricsAndHealth(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(ctx, "bolt:"+filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	l := listenertest.Start(t, listenertest.Options{Config: listener.Config{
		// eleven wrong codes from one address: lift the per-source budget
		Store: st, MetricsListen: "127.0.0.1:0", UnprovenPerSource: -1,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
	}})
	base := "http://" + l.MetricsAddr().String()
	if code, body := get(t, base+"/readyz"); code != 200 {
		t.Fatalf("/readyz before anything: %d %s", code, body)
	}

	good, _ := mint(t, l, adminapi.MintCodeRequest{AutoApprove: true})
	j, dir, err := join(t, l, good, wire.Facts{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := agent.Renew(ctx, agent.RenewConfig{StateDir: dir}); err != nil {
		t.Fatal(err)
	}
	burned, burnedCode := mint(t, l, adminapi.MintCodeRequest{AutoApprove: true})
	bad := wrongCode(t, burned)
	for i := range cluster.MaxUnproven + 1 {
		if _, _, err := join(t, l, bad, wire.Facts{}); !errors.Is(err, agent.ErrNotAccepted) {
			t.Fatalf("wrong code %d: %v", i+1, err)
		}
	}
	var refused *agent.RefusedError
	if _, _, err := join(t, l, burned, wire.Facts{}); !errors.As(err, &refused) || refused.Code != wire.CodeRevoked {
		t.Fatalf("right code after the burn: %v", err)
	}

	// the agent has its last Result before the listener's exchange has
	// returned: wait until none is in flight
	var body string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		_, body = get(t, base+"/metrics")
		if strings.Contains(body, "\nstratum_listener_joins_in_flight 0\n") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("joins still in flight after 30s:\n%s", grepLines(body, "in_flight"))
		}
	}
	for _, want := range []string{
		`stratum_listener_joins_total{kind="code",outcome="joined"} 1`,
		`stratum_listener_joins_total{kind="code",outcome="failed_proof"} 11`,
		`stratum_listener_joins_total{kind="code",outcome="refused"} 1`,
		`stratum_listener_joins_total{kind="token",outcome="joined"} 0`,
		`stratum_listener_refusals_total{code="JOIN_CODE_REVOKED"} 1`,
		`stratum_listener_burns_total{kind="code"} 1`,
		`stratum_listener_attempts_total{counted="true"} 11`,
		`stratum_listener_attempts_total{counted="false"} 2`,
		`stratum_listener_renewals_total{outcome="renewed"} 1`,
		`stratum_listener_joins_in_flight 0`,
		`stratum_listener_approvals_pending 0`,
		`stratum_listener_connections_total{result="accepted"} 14`,
		`stratum_listener_exchange_phase_seconds_count{phase="hello"} 13`,
		`stratum_listener_exchange_phase_seconds_count{phase="prove"} 2`,
		`stratum_listener_store_seconds_count{op="begin_attempt"} 13`,
		`stratum_listener_store_seconds_count{op="renew"} 1`,
	} {
		if !strings.Contains(body, "\n"+want+"\n") {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	for _, op := range []string{"begin_attempt", "prove", "renew"} {
		if !strings.Contains(body, "\nstratum_listener_store_errors_total{op=\""+op+"\"} 0\n") {
			t.Errorf("store errors on a healthy store:\n%s", grepLines(body, "store_errors"))
		}
	}

	// events: the join and the failed proofs name the remote address
	listener.FlushProofFailures(l.Listener)
	evs, err := l.Admin.Events(ctx, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	failed, events := 0, 0
	for _, ev := range evs {
		switch ev.Type {
		case cluster.EventNodeJoined:
			if ev.Fields["nodeId"] == j.Identity.NodeID && !strings.HasPrefix(fmt.Sprint(ev.Fields["remoteAddr"]), "127.0.0.1:") {
				t.Errorf("node.joined without the remote address: %v", ev.Fields)
			}
		case listener.EventProofFailed:
			events++
			if ev.Fields["id"] != burnedCode.ID || !strings.HasPrefix(fmt.Sprint(ev.Fields["remoteAddrs"]), "127.0.0.1:") || ev.Fields["kind"] != "code" {
				t.Errorf("proof-failed event: %v", ev.Fields)
			}
			n, _ := ev.Fields["count"].(float64) // a JSON number, as stored
			failed += int(n)
		}
	}
	// the first failure of the minute at once, the other ten together
	if events != 2 || failed != 11 {
		t.Errorf("%d proof-failed events counting %d failures, want 2 counting 11", events, failed)
	}
	if got := strings.Count(logs.String(), "join proof failed"); got != 11 {
		t.Errorf("%d info lines for failed proofs, want 11", got)
	}
	for _, secret := range []string{string(bad.Password()), string(good.Password()), bad.Display()} {
		if strings.Contains(logs.String(), secret) {
			t.Fatal("a code reached the log")
		}
	}

	// the store goes away: not ready, still alive
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if code, body := get(t, base+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "store") {
		t.Errorf("/readyz with the store closed: %d %s", code, body)
	}
	if code, _ := get(t, base+"/healthz"); code != 200 {
		t.Errorf("/healthz with the store closed: %d", code)
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
