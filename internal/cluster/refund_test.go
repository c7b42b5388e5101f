package cluster_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stratumjoin/stratum/internal/cluster"
	"github.com/stratumjoin/stratum/internal/wire"
)

// nonceOf is attempt i's nonce, commitment and guess, as an agent makes
// them (the guess stands for pake.GuessOf of its KE1).
func nonceOf(who string, i int) (nonce, commit []byte, guess string) {
	n := sha256.Sum256([]byte(fmt.Sprint(who, i)))
	c := sha256.Sum256(n[:])
	return n[:], c[:], fmt.Sprintf("guess-%s-%d", who, i)
}

func prove(t *testing.T, c *cluster.Cluster, att cluster.Attempt, key string, refunds ...[]byte) cluster.Outcome {
	t.Helper()
	out, err := c.Prove(context.Background(), cluster.ProveRequest{
		Attempt: att, Refunds: refunds, KeyFP: key, CurrentCA: "fp",
		NewNodeID: func() (string, error) { return "node-" + key, nil },
		Issue: func(id, role string) (cluster.Cert, error) {
			return cluster.Cert{Serial: "serial-" + key, NotAfter: time.Now().Add(time.Hour)}, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func unproven(t *testing.T, c *cluster.Cluster, id string) (int, bool) {
	t.Helper()
	s, err := c.Secret(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return s.Unproven, s.Burned()
}

// TestCrashedHonestAttemptsResume: ten holders counted and in flight when
// their listener died start again with the same guesses; they resume
// their attempts instead of counting new ones (the 11th start would have
// burned the code), all join, and the failed count returns to 0.
func TestCrashedHonestAttemptsResume(t *testing.T) {
	for name, open := range backends(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			cs := open(t)
			s := mintCode(t, cs[0], 50)
			for i := range 10 {
				_, commit, guess := nonceOf("holder", i)
				att, err := cs[i%2].Begin(ctx, cluster.BeginRequest{Locator: s.Locator, Commit: commit, Guess: guess})
				if err != nil || !att.Counted {
					t.Fatalf("start %d: %+v %v", i, att, err)
				}
			}
			// the listener died: nothing more of those ten attempts.
			// A new holder must wait (not burn) while the leases stand.
			_, commit, guess := nonceOf("late", 0)
			if _, err := cs[0].Begin(ctx, cluster.BeginRequest{Locator: s.Locator, Commit: commit, Guess: guess}); !errors.Is(err, cluster.ErrBusy) {
				t.Fatalf("11th new start: %v, want ErrBusy", err)
			}
			for i := range 10 {
				_, commit, guess := nonceOf("holder", i)
				att, err := cs[(i+1)%2].Begin(ctx, cluster.BeginRequest{Locator: s.Locator, Commit: commit, Guess: guess})
				if err != nil || !att.Counted || !att.Resumed {
					t.Fatalf("restart %d: %+v %v, want a resumed attempt", i, att, err)
				}
				if out := prove(t, cs[i%2], att, fmt.Sprint("k", i)); out.Status != wire.StatusJoined {
					t.Fatalf("holder %d: %+v", i, out)
				}
			}
			if n, burned := unproven(t, cs[0], s.ID); n != 0 || burned {
				t.Fatalf("after the restart: %d failed attempts, burned %v; want 0, live", n, burned)
			}
		})
	}
}

// TestOrphansRefundToTheirNonce: attempts whose lease expired unproven
// are refunded to a proof that reveals their nonces, one each, and a
// nonce revealed twice refunds nothing more.
func TestOrphansRefundToTheirNonce(t *testing.T) {
	for name, open := range backends(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			cs := open(t)
			s := mintCode(t, cs[0], 0)
			var nonces [][]byte
			for i := range 3 {
				nonce, commit, guess := nonceOf("holder", i)
				att, err := cs[0].Begin(ctx, cluster.BeginRequest{Locator: s.Locator, Commit: commit, Guess: guess})
				if err != nil {
					t.Fatal(err)
				}
				if err := cs[1].Orphan(ctx, att); err != nil { // the connection broke
					t.Fatal(err)
				}
				nonces = append(nonces, nonce)
			}
			_, commit, guess := nonceOf("holder", 3)
			att, err := cs[1].Begin(ctx, cluster.BeginRequest{Locator: s.Locator, Commit: commit, Guess: guess})
			if err != nil {
				t.Fatal(err)
			}
			if n, _ := unproven(t, cs[0], s.ID); n != 4 {
				t.Fatalf("%d counted, want 4", n)
			}
			prove(t, cs[0], att, "k", nonces...)
			if n, _ := unproven(t, cs[0], s.ID); n != 0 {
				t.Fatalf("after the refunds: %d failed attempts, want 0", n)
			}
			evs, _ := cs[1].Events(ctx, "", 0)
			if countType(evs, cluster.EventAttemptsRefunded) != 1 {
				t.Errorf("refund events: %d, want 1", countType(evs, cluster.EventAttemptsRefunded))
			}
			// a guesser's failed attempt, then the same nonces again
			_, gcommit, gguess := nonceOf("guesser", 0)
			gatt, err := cs[0].Begin(ctx, cluster.BeginRequest{Locator: s.Locator, Commit: gcommit, Guess: gguess})
			if err != nil {
				t.Fatal(err)
			}
			if err := cs[0].Orphan(ctx, gatt); err != nil {
				t.Fatal(err)
			}
			_, commit, guess = nonceOf("holder", 4)
			att, _ = cs[1].Begin(ctx, cluster.BeginRequest{Locator: s.Locator, Commit: commit, Guess: guess})
			prove(t, cs[1], att, "k2", nonces...)
			if n, _ := unproven(t, cs[0], s.ID); n != 1 {
				t.Fatalf("nonces revealed again: %d failed attempts, want the guesser's 1", n)
			}
		})
	}
}

// TestGuessersGainNothing: ten guessers that drop after KE2, even ones
// that copy an honest holder's commitment or repeat their own guess, keep
// their ten attempts counted, and the start of an 11th new guess burns
// the code.
func TestGuessersGainNothing(t *testing.T) {
	for name, open := range backends(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			cs := open(t)
			s := mintCode(t, cs[0], 0)
			// an honest holder's attempt, orphaned
			hnonce, hcommit, hguess := nonceOf("holder", 0)
			hatt, err := cs[0].Begin(ctx, cluster.BeginRequest{Locator: s.Locator, Commit: hcommit, Guess: hguess})
			if err != nil {
				t.Fatal(err)
			}
			cs[0].Orphan(ctx, hatt)
			// nine guessers, all copying the holder's commitment
			for i := range 9 {
				_, _, guess := nonceOf("guesser", i)
				att, err := cs[i%2].Begin(ctx, cluster.BeginRequest{Locator: s.Locator, Commit: hcommit, Guess: guess})
				if err != nil || !att.Counted || att.Resumed {
					t.Fatalf("guess %d: %+v %v", i, att, err)
				}
				cs[i%2].Orphan(ctx, att)
				// repeating its own guess resumes it: the same question, no new count
				again, err := cs[(i+1)%2].Begin(ctx, cluster.BeginRequest{Locator: s.Locator, Guess: guess})
				if err != nil || !again.Resumed {
					t.Fatalf("repeat of guess %d: %+v %v", i, again, err)
				}
				cs[0].Orphan(ctx, again)
			}
			if n, _ := unproven(t, cs[0], s.ID); n != 10 {
				t.Fatalf("%d counted, want 10", n)
			}
			// the holder comes back: it repeats its guess, resumes its own
			// attempt and reveals its nonce. It gets its one attempt back,
			// and the nine copies of its commitment stay counted.
			hback, err := cs[1].Begin(ctx, cluster.BeginRequest{Locator: s.Locator, Commit: hcommit, Guess: hguess})
			if err != nil || !hback.Resumed {
				t.Fatalf("holder's restart: %+v %v", hback, err)
			}
			if out := prove(t, cs[1], hback, "holder", hnonce); out.Status != wire.StatusJoined {
				t.Fatalf("holder: %+v", out)
			}
			if n, _ := unproven(t, cs[0], s.ID); n != 9 {
				t.Fatalf("after the holder's proof: %d counted, want the 9 guesses", n)
			}
			// the 10th new guess counts, the 11th burns
			for i := range 2 {
				_, _, guess := nonceOf("guesser", 100+i)
				att, err := cs[i%2].Begin(ctx, cluster.BeginRequest{Locator: s.Locator, Guess: guess})
				if err != nil {
					t.Fatal(err)
				}
				if i == 0 {
					if !att.Counted {
						t.Fatal("the 10th guess was not counted")
					}
					cs[0].Orphan(ctx, att)
					continue
				}
				if att.Counted {
					t.Fatal("an 11th new guess was counted")
				}
			}
			if n, burned := unproven(t, cs[0], s.ID); !burned || n != 10 {
				t.Fatalf("after the 11th guess: %d counted, burned %v; want 10, burned", n, burned)
			}
		})
	}
}

func countType(evs []cluster.Event, typ string) int {
	n := 0
	for _, e := range evs {
		if e.Type == typ {
			n++
		}
	}
	return n
}
