package cluster_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stratumjoin/stratum/internal/cluster"
	"github.com/stratumjoin/stratum/internal/joincode"
	"github.com/stratumjoin/stratum/internal/store/boltstore"
	"github.com/stratumjoin/stratum/internal/wire"
)

func boltCluster(t *testing.T) *cluster.Cluster {
	t.Helper()
	s, err := boltstore.Open(filepath.Join(t.TempDir(), "state.db"), boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return cluster.New(cluster.Config{Store: s})
}

func mintKind(t *testing.T, c *cluster.Cluster, id, kind string, maxUses int) *cluster.Secret {
	t.Helper()
	exp := time.Now().Add(time.Hour)
	s, _, err := c.Mint(context.Background(), cluster.SecretSpec{
		Secret:    cluster.Secret{ID: id, Kind: kind, Pool: "p", Role: cluster.RoleNode, Trust: cluster.TrustPlatform, MaxUses: maxUses, ExpiresAt: &exp, CAFingerprint: "fp"},
		EventType: cluster.EventTokenCreated,
		Mint: func(locator string) (joincode.Secret, []byte, error) {
			if kind == cluster.KindCode {
				sec, err := joincode.NewCode(locator)
				return sec, []byte("record"), err
			}
			if kind == cluster.KindKey {
				sec, err := joincode.NewKey(locator)
				return sec, []byte("record"), err
			}
			sec, err := joincode.NewToken(locator)
			return sec, []byte("record"), err
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func eventsOf(t *testing.T, c *cluster.Cluster, typ string) []cluster.Event {
	t.Helper()
	evs, err := c.Events(context.Background(), "", 0)
	if err != nil {
		t.Fatal(err)
	}
	var out []cluster.Event
	for _, ev := range evs {
		if ev.Type == typ {
			out = append(out, ev)
		}
	}
	return out
}

// TestTokensAndKeysCountButNeverBurn: 20 failed proofs against a token and
// a key leave both live and joining; the count is kept and announced at
// 1, 2, 4, 8 and 16 failures, and nothing is burned.
func TestTokensAndKeysCountButNeverBurn(t *testing.T) {
	ctx := context.Background()
	for _, kc := range []struct{ kind, event string }{{cluster.KindToken, cluster.EventTokenFailed}, {cluster.KindKey, cluster.EventKeyFailed}} {
		t.Run(kc.kind, func(t *testing.T) {
			c := boltCluster(t)
			id, err := joincode.NewKeyID()
			if err != nil {
				t.Fatal(err)
			}
			if kc.kind == cluster.KindToken {
				r, _ := joincode.RandomLowerBase32(20)
				id = "jt_" + r
			}
			s := mintKind(t, c, id, kc.kind, 0)
			for i := range 20 {
				att, err := c.BeginAttempt(ctx, s.Locator)
				if err != nil {
					t.Fatalf("start %d: %v", i, err)
				}
				// nothing is written before the KE2: the start counts
				// once it ends unproven
				if att.Counted || !att.Deferred {
					t.Fatalf("start %d: counted %v deferred %v, want a deferred start", i, att.Counted, att.Deferred)
				}
				if got, _ := c.Secret(ctx, s.ID); got.Unproven != i {
					t.Fatalf("start %d: %d counted before it ended, want %d", i, got.Unproven, i)
				}
				if err := c.Abandon(ctx, att); err != nil {
					t.Fatal(err)
				}
			}
			got, _ := c.Secret(ctx, s.ID)
			if got.Burned() || !got.Live(time.Now()) || got.Unproven != 20 {
				t.Fatalf("after 20 failures: burned %v live %v unproven %d", got.Burned(), got.Live(time.Now()), got.Unproven)
			}
			evs := eventsOf(t, c, kc.event)
			var counts []string
			for _, ev := range evs {
				counts = append(counts, fmt.Sprint(ev.Fields["failedAttempts"]))
			}
			if fmt.Sprint(counts) != "[1 2 4 8 16]" {
				t.Errorf("failed-attempt events at %v, want [1 2 4 8 16]", counts)
			}
			if n := len(eventsOf(t, c, cluster.EventSecretBurned)); n != 0 {
				t.Errorf("%d burn events", n)
			}
			att, err := c.BeginAttempt(ctx, s.Locator)
			if err != nil {
				t.Fatal(err)
			}
			if out := prove(t, c, att, "k1"); out.Status != wire.StatusJoined {
				t.Fatalf("join after the storm: %+v", out)
			}
			got, _ = c.Secret(ctx, s.ID)
			if got.Unproven != 20 {
				t.Errorf("failed count %d after an honest join, want 20", got.Unproven)
			}
		})
	}
}

// TestCodeStillBurns: the eleventh start on a code burns it.
func TestCodeStillBurns(t *testing.T) {
	ctx := context.Background()
	c := boltCluster(t)
	s := mintKind(t, c, "jc-burn", cluster.KindCode, 0)
	for range cluster.MaxUnproven {
		att, err := c.BeginAttempt(ctx, s.Locator)
		if err != nil || !att.Counted {
			t.Fatalf("start: %v counted %v", err, att.Counted)
		}
		if err := c.Abandon(ctx, att); err != nil {
			t.Fatal(err)
		}
	}
	if att, err := c.BeginAttempt(ctx, s.Locator); err != nil || att.Counted {
		t.Fatalf("11th start: %v counted %v", err, att.Counted)
	}
	got, _ := c.Secret(ctx, s.ID)
	if !got.Burned() || len(eventsOf(t, c, cluster.EventSecretBurned)) != 1 {
		t.Fatalf("burned %v", got.Burned())
	}
}

// TestBurnDropsOrphans: the commitments of a code's orphaned attempts are
// kept for refunds while it is live, and dropped when it burns (nothing
// revives a burned code); its count of failed attempts stays.
func TestBurnDropsOrphans(t *testing.T) {
	ctx := context.Background()
	c := boltCluster(t)
	s := mintKind(t, c, "jc-orphans", cluster.KindCode, 0)
	for i := range cluster.MaxUnproven {
		_, commit, guess := nonceOf("burner", i)
		att, err := c.Begin(ctx, cluster.BeginRequest{Locator: s.Locator, Commit: commit, Guess: guess})
		if err != nil || !att.Counted {
			t.Fatalf("start %d: %v counted %v", i, err, att.Counted)
		}
		if err := c.Orphan(ctx, att); err != nil {
			t.Fatal(err)
		}
	}
	if got, _ := c.Secret(ctx, s.ID); len(got.Orphans) != cluster.MaxUnproven {
		t.Fatalf("%d orphans before the burn, want %d", len(got.Orphans), cluster.MaxUnproven)
	}
	if att, err := c.Begin(ctx, cluster.BeginRequest{Locator: s.Locator, Guess: "the 11th"}); err != nil || !att.Burned {
		t.Fatalf("11th start: %+v, %v; want it to burn the code", att, err)
	}
	got, _ := c.Secret(ctx, s.ID)
	if !got.Burned() || len(got.Orphans) != 0 || got.Unproven != cluster.MaxUnproven {
		t.Fatalf("after the burn: burned %v, %d orphans, unproven %d; want burned, none, %d", got.Burned(), len(got.Orphans), got.Unproven, cluster.MaxUnproven)
	}
}

// TestUsedUpCodeIsRevoked: the join that spends a code's last use revokes
// it by system:used-up at that moment, with one event; a new key is then
// refused as used up, while the key that holds a join resumes it.
func TestUsedUpCodeIsRevoked(t *testing.T) {
	ctx := context.Background()
	c := boltCluster(t)
	s := mintKind(t, c, "jc-batch", cluster.KindCode, 2)
	for i := range 2 {
		att, err := c.BeginAttempt(ctx, s.Locator)
		if err != nil {
			t.Fatal(err)
		}
		if out := prove(t, c, att, fmt.Sprint("k", i)); out.Status != wire.StatusJoined {
			t.Fatalf("join %d: %+v", i, out)
		}
		got, _ := c.Secret(ctx, s.ID)
		if i == 0 && got.RevokedAt != nil {
			t.Fatal("revoked with a use left")
		}
	}
	got, _ := c.Secret(ctx, s.ID)
	if got.RevokedAt == nil || got.RevokedBy != cluster.UsedUpBy || got.State(time.Now()) != "revoked" {
		t.Fatalf("after the last use: revokedBy %q state %s", got.RevokedBy, got.State(time.Now()))
	}
	evs := eventsOf(t, c, cluster.EventCodeRevoked)
	if len(evs) != 1 || evs[0].Actor != cluster.UsedUpBy || evs[0].Fields["id"] != s.ID {
		t.Fatalf("revocation events %+v", evs)
	}
	att, err := c.BeginAttempt(ctx, s.Locator)
	if err != nil {
		t.Fatal(err)
	}
	if out := prove(t, c, att, "k9"); out.Code != wire.CodeUsedUp {
		t.Fatalf("a third machine: %+v", out)
	}
	// the first machine lost its Result: it resumes its join
	if out := prove(t, c, att, "k0"); out.Status != wire.StatusJoined {
		t.Fatalf("resume after used up: %+v", out)
	}
}

// TestTokenStartCountsWhenItEnds: a token's start writes nothing before
// its KE2; one whose connection broke after the Challenge is counted when
// it ends, and its commitment stays refundable, so the holder's next proof
// that reveals the nonce takes the count back, on either backend.
func TestTokenStartCountsWhenItEnds(t *testing.T) {
	for name, open := range backends(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			cs := open(t)
			r, _ := joincode.RandomLowerBase32(20)
			s := mintKind(t, cs[0], "jt_"+r, cluster.KindToken, 0)
			nonce, commit, _ := nonceOf("holder", 0)
			att, err := cs[0].Begin(ctx, cluster.BeginRequest{Locator: s.Locator, Commit: commit})
			if err != nil || att.Counted || !att.Deferred || att.Secret == nil {
				t.Fatalf("start: %+v %v, want a deferred start", att, err)
			}
			if n, _ := unproven(t, cs[1], s.ID); n != 0 {
				t.Fatalf("%d counted before the start ended", n)
			}
			if err := cs[0].Orphan(ctx, att); err != nil {
				t.Fatal(err)
			}
			if n, _ := unproven(t, cs[1], s.ID); n != 1 {
				t.Fatalf("%d counted after the orphaned start, want 1", n)
			}
			again, err := cs[1].Begin(ctx, cluster.BeginRequest{Locator: s.Locator})
			if err != nil {
				t.Fatal(err)
			}
			if out := prove(t, cs[1], again, "k0", nonce); out.Status != wire.StatusJoined {
				t.Fatalf("join: %+v", out)
			}
			if n, burned := unproven(t, cs[0], s.ID); n != 0 || burned {
				t.Fatalf("after the refunding proof: %d counted, burned %v; want 0", n, burned)
			}
			// an unknown locator of a token's shape is looked up, not counted
			unknown, err := cs[0].Begin(ctx, cluster.BeginRequest{Locator: "jt_" + strings.Repeat("z", 26)})
			if err != nil || unknown.Secret != nil || unknown.Counted {
				t.Fatalf("unknown token locator: %+v %v", unknown, err)
			}
		})
	}
}

// TestCountsBeforeKE2ByShape: a join code's selector, and any locator of no
// secret's shape, is counted before its KE2; a token's and a key's are not.
func TestCountsBeforeKE2ByShape(t *testing.T) {
	for _, tc := range []struct {
		locator string
		counted bool
	}{
		{"4F", true},
		{"", true},
		{"not-a-locator", true},
		{"jt_" + strings.Repeat("a", 25), true},
		{"jt_" + strings.Repeat("a", 26), false},
		{"dnjoin-" + strings.Repeat("A", 26), false},
		{"dnjoin-" + strings.Repeat("A", 27), true},
	} {
		if got := cluster.CountsBeforeKE2(tc.locator); got != tc.counted {
			t.Errorf("CountsBeforeKE2(%q) = %v, want %v", tc.locator, got, tc.counted)
		}
	}
}
