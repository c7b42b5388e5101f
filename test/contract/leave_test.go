package contract

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stratumjoin/stratum/agent"
)

// copyState copies the agent's state files into a new directory, and
// lets edit rewrite node.json's decoded form first.
func copyState(t *testing.T, from string, edit func(map[string]any)) string {
	t.Helper()
	to := filepath.Join(t.TempDir(), "copy")
	if err := os.Mkdir(to, 0o700); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(from)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(from, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if e.Name() == agent.NodeFile && edit != nil {
			var m map[string]any
			if err := json.Unmarshal(b, &m); err != nil {
				t.Fatal(err)
			}
			edit(m)
			if b, err = json.Marshal(m); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(to, e.Name()), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return to
}

func names(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// TestLeave: `stratum-agent leave` revokes the node's certificate over
// mutual TLS and wipes the state directory; the node is revoked by itself,
// and a saved copy of its certificate no longer renews. A listener that
// cannot be reached exits 3 and wipes nothing.
func TestLeave(t *testing.T) {
	srv := startServer(t)
	code, _ := srv.mint(t)
	state := filepath.Join(t.TempDir(), "state")
	if p := runBin(t, runOpts{stdin: code + "\n"}, "stratum-agent", "join", "--endpoint", srv.endpoint, "--code", "-", "--state", state); p.exit != 0 {
		t.Fatalf("join: %d %s", p.exit, p.stderr)
	}
	var id agent.Identity
	b, err := os.ReadFile(filepath.Join(state, agent.NodeFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &id); err != nil || id.NodeID == "" {
		t.Fatalf("node.json: %v %s", err, b)
	}
	saved := copyState(t, state, nil)

	// unreachable: exit 3, nothing wiped
	dead := copyState(t, state, func(m map[string]any) {
		m["endpoint"] = "127.0.0.1:1"
		delete(m, "endpoints")
	})
	before := names(t, dead)
	if p := runBin(t, runOpts{}, "stratum-agent", "leave", "--state", dead); p.exit != 3 || !strings.Contains(p.stderr, "left as it was") {
		t.Errorf("leave, unreachable: %d %s", p.exit, p.stderr)
	}
	if got := names(t, dead); strings.Join(got, ",") != strings.Join(before, ",") {
		t.Errorf("unreachable leave changed the state: %v, was %v", got, before)
	}
	if p := runBin(t, runOpts{}, "stratum-agent", "leave", "--state", state, "extra"); p.exit != 2 {
		t.Errorf("leave with an argument: %d %s", p.exit, p.stderr)
	}

	p := runBin(t, runOpts{}, "stratum-agent", "leave", "--state", state)
	if p.exit != 0 || !strings.Contains(p.stdout, id.NodeID+" left the cluster") {
		t.Fatalf("leave: %d %s %s", p.exit, p.stdout, p.stderr)
	}
	if got := names(t, state); len(got) != 0 {
		t.Errorf("state after leave: %v, want empty", got)
	}

	p = srv.admin(t, "nodes", "show", id.NodeID, "--json")
	var node struct{ State, RevokedBy string }
	if err := json.Unmarshal([]byte(p.stdout), &node); p.exit != 0 || err != nil {
		t.Fatalf("nodes show: %d %v %s %s", p.exit, err, p.stdout, p.stderr)
	}
	if node.State != "revoked" || node.RevokedBy != "node:"+id.NodeID {
		t.Errorf("nodes show after leave: state %q revokedBy %q", node.State, node.RevokedBy)
	}
	p = srv.admin(t, "events", "--json", "--type", "node.revoked")
	var ev struct {
		Type, Actor string
		Fields      map[string]any
	}
	if err := json.Unmarshal([]byte(strings.TrimSpace(p.stdout)), &ev); err != nil || ev.Actor != "node:"+id.NodeID {
		t.Errorf("node.revoked event: %v %s", err, p.stdout)
	}

	// the saved certificate is refused, for renewal and for a second leave
	if p := runBin(t, runOpts{}, "stratum-agent", "renew", "--now", "--state", saved); p.exit != 1 || !strings.Contains(p.stderr, "revoked") {
		t.Errorf("renew with the old certificate: %d %s", p.exit, p.stderr)
	}
	if p := runBin(t, runOpts{}, "stratum-agent", "leave", "--state", saved); p.exit != 1 || !strings.Contains(p.stderr, "NODE_REVOKED") {
		t.Errorf("second leave: %d %s", p.exit, p.stderr)
	}
	if got := names(t, saved); len(got) == 0 {
		t.Error("a refused leave wiped the state")
	}
}
