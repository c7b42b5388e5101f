package agent_test

import (
	"context"
	"testing"
	"time"

	"github.com/stratumjoin/stratum/agent"
	"github.com/stratumjoin/stratum/listener/adminapi"
	"github.com/stratumjoin/stratum/listener/listenertest"
)

// TestJoinReleasesTheListenerBeforeSaving: the listener holds a join's
// connection until its agent closes it. The agent closes it as soon as it
// has read the final Result, so its checks and durable writes do not hold
// the listener's connection (a slow disk, or a herd's busy CPU, would
// otherwise keep hundreds open on the listener).
func TestJoinReleasesTheListenerBeforeSaving(t *testing.T) {
	l := listenertest.Start(t, listenertest.Options{})
	sec, _ := l.MintCode(t, adminapi.MintCodeRequest{AutoApprove: true})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	served := -1
	cfg := agent.WithBeforeSave(agent.JoinConfig{StateDir: t.TempDir(), Endpoint: l.Endpoint, Secret: sec}, func() {
		// what the listener serves while the agent is about to write
		wait, stop := context.WithTimeout(ctx, 5*time.Second)
		defer stop()
		for served = l.ConnStats().Joins; served > 0 && wait.Err() == nil; served = l.ConnStats().Joins {
			time.Sleep(5 * time.Millisecond) // polling for the listener to let go
		}
	})
	j, err := agent.Join(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if served != 0 {
		t.Fatalf("the listener still served %d join connections while the agent saved its credentials", served)
	}
	if j.Identity.NodeID == "" {
		t.Fatal("joined with no node id")
	}
}
