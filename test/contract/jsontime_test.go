package contract

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// timeKey is a field that holds a time: createdAt, notAfter,
// renewAfter, lastRenewal, expires, time, date, ...
var timeKey = regexp.MustCompile(`(?i)(At|After|Before|Renewal|^time|^date|^expires|^since)$`)

// walkJSON checks every value of v: no null anywhere (an absent value is
// left out, never null, never ""), and every time-like field a string in
// RFC 3339, in UTC.
func walkJSON(t *testing.T, where, path string, v any) {
	t.Helper()
	switch x := v.(type) {
	case nil:
		t.Errorf("%s: %s is null", where, path)
	case map[string]any:
		for k, e := range x {
			p := path + "." + k
			if timeKey.MatchString(k) {
				s, ok := e.(string)
				if !ok {
					t.Errorf("%s: %s is %v, not a time string", where, p, e)
					continue
				}
				ts, err := time.Parse(time.RFC3339, s)
				if err != nil || !strings.HasSuffix(s, "Z") || ts.IsZero() || ts.Year() < 2000 {
					t.Errorf("%s: %s = %q is not an RFC 3339 time in UTC", where, p, s)
				}
			}
			walkJSON(t, where, p, e)
		}
	case []any:
		for i, e := range x {
			walkJSON(t, where, fmt.Sprintf("%s[%d]", path, i), e)
		}
	case string:
		if x == "" {
			t.Errorf("%s: %s is \"\" (leave an absent value out)", where, path)
		}
	}
}

func checkJSONOutput(t *testing.T, where, out string) {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(out))
	n := 0
	for dec.More() {
		var v any
		if err := dec.Decode(&v); err != nil {
			t.Errorf("%s: %v: %s", where, err, out)
			return
		}
		walkJSON(t, where, "", v)
		n++
	}
	if n == 0 {
		t.Errorf("%s: no JSON: %q", where, out)
	}
}

// TestJSONTimes walks the --json output of both binaries' list and show
// commands after a join, a pending join, a revoked code and a renewal.
func TestJSONTimes(t *testing.T) {
	srv := startServer(t)
	code, codeID := srv.mint(t)
	state := filepath.Join(t.TempDir(), "state")
	p := runBin(t, runOpts{stdin: code + "\n"}, "stratum-agent", "--json", "join", "--endpoint", srv.endpoint, "--code", "-", "--state", state)
	if p.exit != 0 {
		t.Fatalf("join: %d %s", p.exit, p.stderr)
	}
	checkJSONOutput(t, "agent join", p.stdout)
	var joined struct{ NodeID string }
	_ = json.Unmarshal([]byte(p.stdout), &joined)

	run := func(where string, bin string, args ...string) {
		t.Helper()
		var p proc
		if bin == "listener" {
			p = srv.admin(t, append([]string{"--json"}, args...)...)
		} else {
			p = runBin(t, runOpts{}, "stratum-agent", append([]string{"--json"}, args...)...)
		}
		if p.exit != 0 {
			t.Errorf("%s: %d %s", where, p.exit, p.stderr)
			return
		}
		checkJSONOutput(t, where, p.stdout)
	}
	run("agent status", "agent", "status", "--state", state)
	run("agent renew --now", "agent", "renew", "--now", "--state", state)
	run("agent status after renewal", "agent", "status", "--state", state)
	run("agent version", "agent", "version")

	// a pending join (approval required), a revoked code
	pending := srv.admin(t, "codes", "create", "--json", "--description", "held", "--label", "rack=r1")
	checkJSONOutput(t, "codes create", pending.stdout)
	var pc struct{ ID string }
	_ = json.Unmarshal([]byte(pending.stdout), &pc)
	run("codes revoke", "listener", "codes", "revoke", pc.ID)
	run("codes list --all", "listener", "codes", "list", "--all")
	run("codes show", "listener", "codes", "show", codeID)
	run("nodes list", "listener", "nodes", "list")
	run("nodes show", "listener", "nodes", "show", joined.NodeID)
	run("nodes revoke", "listener", "nodes", "revoke", joined.NodeID)
	run("nodes show revoked", "listener", "nodes", "show", joined.NodeID)
	// a join held for approval, while its agent waits
	held := srv.admin(t, "codes", "create", "--json", "--max-uses", "1")
	var hc struct{ Code string }
	if err := json.Unmarshal([]byte(held.stdout), &hc); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	agentCmd := exec.CommandContext(ctx, filepath.Join(binDir, "stratum-agent"), "join", "--endpoint", srv.endpoint, "--code", "-", "--state", filepath.Join(t.TempDir(), "held"))
	agentCmd.Stdin = strings.NewReader(hc.Code + "\n")
	if err := agentCmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); agentCmd.Wait() })
	deadline := time.Now().Add(time.Minute)
	for {
		p := srv.admin(t, "joins", "list", "--json")
		if strings.Contains(p.stdout, `"pending"`) {
			checkJSONOutput(t, "joins list", p.stdout)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no pending join: %s %s", p.stdout, p.stderr)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if p := srv.admin(t, "apikeys", "create", "--json", "--tenant", "default", "--name", "ro", "--grant", "ha:DescribeJoinCodes@cluster"); p.exit != 0 {
		t.Fatalf("apikeys create: %d %s", p.exit, p.stderr)
	} else {
		checkJSONOutput(t, "apikeys create", p.stdout)
	}
	run("ca show", "listener", "ca", "show")
	run("events", "listener", "events")
	run("apikeys list", "listener", "apikeys", "list")
	run("listener version", "listener", "version")
}
