package listener_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stratumjoin/stratum/agent"
	"github.com/stratumjoin/stratum/internal/wire"
	"github.com/stratumjoin/stratum/listener/adminapi"
)

// TestLeaveRefusesReclaimedCertificate: a certificate of a generation a
// reclaim replaced cannot make the node that now holds the id leave; the
// state of the refused machine is kept; the machine that holds the id
// now leaves, revoked by itself.
func TestLeaveRefusesReclaimedCertificate(t *testing.T) {
	facts := wire.Facts{ProductUUID: "4C4C4544-0042-3510-8051-B7C04F4E3733"}
	f := joinedNode(t, facts)
	sec, _ := mint(t, f.l, adminapi.MintCodeRequest{AutoApprove: true, AllowReclaim: true})
	newDir := filepath.Join(t.TempDir(), "new")
	j, err := agent.Join(context.Background(), agent.JoinConfig{StateDir: newDir, Endpoint: f.l.Endpoint, Secret: sec, Facts: facts, Now: f.clock.Now})
	if err != nil || j.Identity.NodeID != f.id.NodeID {
		t.Fatalf("reclaim: %v", err)
	}
	_, err = agent.Leave(context.Background(), agent.RenewConfig{StateDir: f.dir, Now: f.clock.Now})
	var refused *agent.RefusedError
	if !errors.As(err, &refused) || refused.Code != wire.CodeNodeRevoked {
		t.Fatalf("leave with the reclaimed certificate: %v", err)
	}
	if _, err := os.Stat(filepath.Join(f.dir, agent.KeyFile)); err != nil {
		t.Errorf("a refused leave removed the key: %v", err)
	}
	// the machine that reclaimed the id still renews, then leaves
	if _, err := agent.Renew(context.Background(), agent.RenewConfig{StateDir: newDir, Now: f.clock.Now}); err != nil {
		t.Fatalf("renew of the reclaimed node: %v", err)
	}
	if _, err := agent.Leave(context.Background(), agent.RenewConfig{StateDir: newDir, Now: f.clock.Now}); err != nil {
		t.Fatalf("leave: %v", err)
	}
	n, err := f.l.Admin.Node(context.Background(), f.id.NodeID)
	if err != nil || n.State != "revoked" || n.RevokedBy != "node:"+f.id.NodeID {
		t.Fatalf("node after leave: %+v %v", n, err)
	}
}
