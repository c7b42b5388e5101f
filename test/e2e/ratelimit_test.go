package e2e

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stratumjoin/stratum/internal/joincode"
)

// TestJoinOverBudgetExitsThree: once an address has spent its budget of
// unproven starts, `stratum-agent join` with the right code is told to
// come back later and exits 3 (try again), not 1, saying when; the code
// is untouched by the refused start.
func TestJoinOverBudgetExitsThree(t *testing.T) {
	l := newListenerServe(t, []string{"--unproven-per-source=1", "--budget-wait=10ms"})
	var c mintedCode
	l.adminJSON(&c, "codes", "create", "--auto-approve", "--max-uses", "1")
	sec, err := joincode.Parse(c.Code)
	if err != nil {
		t.Fatal(err)
	}
	wrong, err := joincode.NewCode(sec.Locator)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if r := agentJoin(context.Background(), l.endpoint, wrong.Display(), filepath.Join(dir, "guess")); r.exit != 1 {
		t.Fatalf("wrong code: %+v, want exit 1", r)
	}
	r := agentJoin(context.Background(), l.endpoint, c.Code, filepath.Join(dir, "right"))
	if r.exit != 3 || !strings.Contains(r.stderr, "try again later") || !strings.Contains(r.stderr, "retry in") {
		t.Fatalf("right code over budget: %+v, want exit 3 with when to retry", r)
	}
	var after mintedCode
	l.adminJSON(&after, "codes", "show", c.ID)
	if after.FailedAttempts != 1 || after.State != "live" {
		t.Fatalf("code after the refused start: %+v", after)
	}
}
