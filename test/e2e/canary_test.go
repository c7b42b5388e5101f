package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stratumjoin/stratum/internal/joincode"
)

// TestCanaryNeverLeaks mints codes, uses them every way (join, wrong
// code, revoked, used up) with debug logging on both sides, then looks
// for them everywhere but the one answer that mints them.
func TestCanaryNeverLeaks(t *testing.T) {
	l := newListener(t)
	ctx := context.Background()
	var canaries []string
	mintCode := func(args ...string) mintedCode {
		var c mintedCode
		l.adminJSON(&c, append([]string{"codes", "create", "--auto-approve", "--max-uses", "1"}, args...)...)
		sec, err := joincode.Parse(c.Code)
		if err != nil {
			t.Fatal(err)
		}
		raw := string(sec.Password())
		canaries = append(canaries, c.Code, raw, strings.ToLower(c.Code), strings.ToLower(raw), raw[2:])
		return c
	}
	var outputs []string
	note := func(r agentResult) { outputs = append(outputs, r.stdout, r.stderr) }
	dir := t.TempDir()

	a := mintCode()
	if r := agentJoin(ctx, l.endpoint, a.Code, filepath.Join(dir, "a"), "--verbose"); r.exit != 0 {
		t.Fatalf("join: %+v", r)
	} else {
		note(r)
	}
	r := agentJoin(ctx, l.endpoint, a.Code, filepath.Join(dir, "a-again"), "--verbose")
	if r.exit != 1 || !strings.Contains(r.stderr, "no uses left") {
		t.Fatalf("used-up join: %+v", r)
	}
	note(r)

	b := mintCode()
	if _, err := l.admin("codes", "revoke", b.ID); err != nil {
		t.Fatal(err)
	}
	r = agentJoin(ctx, l.endpoint, b.Code, filepath.Join(dir, "b"), "--verbose")
	if r.exit != 1 || !strings.Contains(r.stderr, "revoked") {
		t.Fatalf("revoked join: %+v", r)
	}
	note(r)

	c := mintCode()
	sec, _ := joincode.Parse(c.Code)
	var wrong joincode.Secret
	for wrong.Locator == "" || string(wrong.Password()) == string(sec.Password()) {
		wrong, _ = joincode.NewCode(sec.Locator)
	}
	canaries = append(canaries, wrong.Display(), string(wrong.Password()))
	r = agentJoin(ctx, l.endpoint, wrong.Display(), filepath.Join(dir, "c"), "--verbose")
	if r.exit != 1 || !strings.Contains(r.stderr, "code not accepted") {
		t.Fatalf("wrong code: %+v", r)
	}
	note(r)
	// a code on the command line warns, and still does not reach any log;
	// this machine is already a node of the default pool, so another pool
	d := mintCode("--pool", "second")
	r = agentJoin(ctx, l.endpoint, "", filepath.Join(dir, "d"), "--verbose", "--code", d.Code)
	if r.exit != 0 || !strings.Contains(r.stderr, "visible to every user through ps") {
		t.Fatalf("argv join: %+v", r)
	}
	note(r)

	for _, args := range [][]string{{"events", "--json"}, {"codes", "list", "--all", "--json"}, {"nodes", "list", "--json"}, {"joins", "list", "--json"}, {"codes", "show", a.ID, "--json"}} {
		out, err := l.admin(args...)
		if err != nil {
			t.Fatal(err)
		}
		outputs = append(outputs, string(out))
	}
	l.stop()
	outputs = append(outputs, l.logs...)
	if !strings.Contains(strings.Join(l.logs, ""), `"level":"DEBUG"`) {
		t.Fatal("listener logged nothing at debug level: the test would prove nothing")
	}
	var files []string
	for _, root := range []string{l.data, dir} {
		filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
			if err == nil && fi.Mode().IsRegular() {
				b, err := os.ReadFile(p)
				if err != nil {
					t.Fatal(err)
				}
				files = append(files, p)
				outputs = append(outputs, string(b))
			}
			return nil
		})
	}
	if len(files) < 10 {
		t.Fatalf("only %d files looked at", len(files))
	}
	for _, canary := range canaries {
		for i, out := range outputs {
			if strings.Contains(out, canary) {
				t.Errorf("secret %q found in output %d: %.300s", canary, i, out)
			}
		}
	}
}
