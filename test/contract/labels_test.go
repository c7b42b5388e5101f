package contract

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestCodeLabels runs `codes create --description --label`, `codes list
// [--label]` and `codes show` against a live listener, and the refusals
// of bad labels as usage errors that name the flag.
func TestCodeLabels(t *testing.T) {
	srv := startServer(t)
	create := func(args ...string) string {
		t.Helper()
		p := srv.admin(t, append([]string{"codes", "create", "--json"}, args...)...)
		if p.exit != 0 {
			t.Fatalf("codes create %v: %d %s", args, p.exit, p.stderr)
		}
		var c struct{ ID string }
		if err := json.Unmarshal([]byte(p.stdout), &c); err != nil {
			t.Fatal(err)
		}
		return c.ID
	}
	rack := create("--description", "rack 12 batch", "--label", "rack=r12", "--label", "team=infra")
	other := create("--label", "rack=r13")
	plain := create()

	p := srv.admin(t, "codes", "create", "--description", "rack 14", "--label", "rack=r14")
	if p.exit != 0 || !strings.Contains(p.stdout, "description rack 14") || !strings.Contains(p.stdout, "labels     rack=r14") {
		t.Errorf("codes create, human: %d %s %s", p.exit, p.stdout, p.stderr)
	}

	p = srv.admin(t, "codes", "list")
	if p.exit != 0 {
		t.Fatalf("codes list: %d %s", p.exit, p.stderr)
	}
	for _, line := range strings.Split(p.stdout, "\n") {
		if strings.HasPrefix(line, rack+" ") && !(strings.Contains(line, "rack=r12,team=infra") && strings.HasSuffix(strings.TrimSpace(line), "rack 12 batch")) {
			t.Errorf("codes list row: %q", line)
		}
		if strings.HasPrefix(line, plain+" ") && !strings.HasSuffix(strings.Join(strings.Fields(line), " "), " - -") {
			t.Errorf("codes list row without labels: %q", line)
		}
	}

	list := func(args ...string) []string {
		t.Helper()
		p := srv.admin(t, append([]string{"codes", "list", "--json"}, args...)...)
		if p.exit != 0 {
			t.Fatalf("codes list %v: %d %s", args, p.exit, p.stderr)
		}
		var out struct {
			Items []struct {
				ID          string
				Description string
				Labels      map[string]string
			}
		}
		if err := json.Unmarshal([]byte(p.stdout), &out); err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, it := range out.Items {
			ids = append(ids, it.ID)
			if it.ID == rack && (it.Description != "rack 12 batch" || it.Labels["rack"] != "r12" || it.Labels["team"] != "infra") {
				t.Errorf("codes list --json: %+v", it)
			}
		}
		return ids
	}
	if got := list("--label", "rack=r12"); strings.Join(got, ",") != rack {
		t.Errorf("--label rack=r12: %v", got)
	}
	if got := list("--label", "rack=r13"); strings.Join(got, ",") != other {
		t.Errorf("--label rack=r13: %v", got)
	}
	if got := list("--label", "rack=r12", "--label", "team=web"); len(got) != 0 {
		t.Errorf("--label rack=r12 --label team=web: %v", got)
	}
	if got := list(); len(got) != 4 {
		t.Errorf("codes list: %v", got)
	}

	p = srv.admin(t, "codes", "show", rack)
	var shown struct {
		Description string
		Labels      map[string]string
	}
	if err := json.Unmarshal([]byte(p.stdout), &shown); err != nil || shown.Description != "rack 12 batch" || shown.Labels["team"] != "infra" {
		t.Errorf("codes show: %v %s", err, p.stdout)
	}

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"codes", "create", "--label", "Rack=r1"}, "--label Rack"},
		{[]string{"codes", "create", "--label", "rack"}, "KEY=VALUE"},
		{[]string{"codes", "create", "--label", "rack=a b"}, "--label rack"},
		{[]string{"codes", "create", "--description", strings.Repeat("x", 257)}, "--description"},
		{[]string{"codes", "list", "--label", "rack"}, "KEY=VALUE"},
		{[]string{"codes", "list", "--label", "rack=a b"}, "--label"},
	} {
		if p := srv.admin(t, c.args...); p.exit != 2 || !strings.Contains(p.stderr, c.want) {
			t.Errorf("%v: exit %d, want 2 naming %s: %s", c.args, p.exit, c.want, p.stderr)
		}
	}
}
