package agent_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stratumjoin/stratum/agent"
	"github.com/stratumjoin/stratum/listener/adminapi"
	"github.com/stratumjoin/stratum/listener/listenertest"
)

func scrape(t *testing.T, addr string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestAgentMetrics: before the join the agent reports not joined; after
// it, its certificate's expiry; renewals and retries are counted.
func TestAgentMetrics(t *testing.T) {
	l := listenertest.Start(t, listenertest.Options{})
	dir := filepath.Join(t.TempDir(), "state")
	m := agent.NewMetrics(dir)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go m.Serve(ctx, ln, nil)
	addr := ln.Addr().String()

	if body := scrape(t, addr); !strings.Contains(body, "\nstratum_agent_joined 0\n") {
		t.Errorf("before the join:\n%s", body)
	}
	sec, _ := l.MintCode(t, adminapi.MintCodeRequest{AutoApprove: true})
	j, err := agent.Join(ctx, agent.JoinConfig{StateDir: dir, Endpoint: l.Endpoint, Secret: sec})
	if err != nil {
		t.Fatal(err)
	}
	id, err := agent.Renew(ctx, agent.RenewConfig{StateDir: dir})
	m.Renewed(err)
	m.Retried(0, 0, nil)
	body := scrape(t, addr)
	for _, want := range []string{
		"stratum_agent_joined 1",
		fmt.Sprintf("stratum_agent_certificate_expiry_timestamp_seconds %g", float64(id.NotAfter.Unix())),
		fmt.Sprintf("stratum_agent_last_renewal_timestamp_seconds %g", float64(id.LastRenewal.Unix())),
		"stratum_agent_renewal_failing 0",
		`stratum_agent_renewals_total{outcome="renewed"} 1`,
		`stratum_agent_renewals_total{outcome="failed"} 0`,
		"stratum_agent_retries_total 1",
	} {
		if !strings.Contains(body, "\n"+want+"\n") {
			t.Errorf("/metrics lacks %s:\n%s", want, body)
		}
	}
	if j.Identity.NodeID == "" {
		t.Fatal("no node id")
	}
}
