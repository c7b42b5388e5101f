// Package deploy checks the monitoring files in deploy/ against the
// binaries: every series the Grafana dashboard and the alert rules name
// is one the listener or the agent exports.
package deploy

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stratumjoin/stratum/agent"
	"github.com/stratumjoin/stratum/listener"
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

var seriesName = regexp.MustCompile(`\bstratum_[a-z_]+`)

func TestDeployNamesRealSeries(t *testing.T) {
	l := listenertest.Start(t, listenertest.Options{Config: listener.Config{MetricsListen: "127.0.0.1:0"}})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go agent.NewMetrics(t.TempDir()).Serve(ctx, ln, nil)
	exported := map[string]bool{}
	for _, body := range []string{scrape(t, l.MetricsAddr().String()), scrape(t, ln.Addr().String())} {
		for _, line := range strings.Split(body, "\n") {
			if name, ok := strings.CutPrefix(line, "# TYPE "); ok {
				exported[strings.Fields(name)[0]] = true
			}
		}
	}
	// the agent reports its certificate only once joined, and a refusal
	// code appears with the first refusal
	for _, n := range []string{"stratum_agent_certificate_expiry_timestamp_seconds", "stratum_agent_renewal_failing", "stratum_listener_refusals_total"} {
		exported[n] = true
	}
	dash, err := os.ReadFile("../../deploy/grafana/stratum-join.json")
	if err != nil {
		t.Fatal(err)
	}
	if !json.Valid(dash) {
		t.Fatal("the dashboard is not JSON")
	}
	rules, err := os.ReadFile("../../deploy/prometheus/stratum.rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	for file, text := range map[string][]byte{"dashboard": dash, "rules": rules} {
		names := seriesName.FindAllString(string(text), -1)
		if len(names) == 0 {
			t.Errorf("%s names no series", file)
		}
		for _, n := range names {
			base := n
			for _, suf := range []string{"_bucket", "_count", "_sum"} {
				if b, ok := strings.CutSuffix(n, suf); ok && exported[b] {
					base = b
				}
			}
			if !exported[base] {
				t.Errorf("%s names %s, which neither binary exports", file, n)
			}
		}
	}
}
