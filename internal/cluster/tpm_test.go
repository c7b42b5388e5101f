package cluster_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stratumjoin/stratum/internal/cluster"
	"github.com/stratumjoin/stratum/internal/joincode"
	"github.com/stratumjoin/stratum/internal/store/boltstore"
	"github.com/stratumjoin/stratum/internal/wire"
)

// TestTPMRules: an ekHash pin and a pool's requireTPM refuse without
// spending a use; the EK hash is the node's identity for NODE_EXISTS; an
// attested node renews only with its key.
func TestTPMRules(t *testing.T) {
	ctx := context.Background()
	s, err := boltstore.Open(filepath.Join(t.TempDir(), "state.db"), boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c := cluster.New(cluster.Config{Store: s})
	var n atomic.Int32
	mint := func(id string, expect *cluster.Expect) *cluster.Secret {
		t.Helper()
		exp := time.Now().Add(time.Hour)
		sec, _, err := c.Mint(ctx, cluster.SecretSpec{
			Secret:    cluster.Secret{ID: id, Kind: cluster.KindCode, Pool: "p", Role: cluster.RoleNode, Trust: cluster.TrustPlatform, MaxUses: 1, ExpiresAt: &exp, CAFingerprint: "fp", Expect: expect},
			EventType: cluster.EventCodeCreated,
			Mint: func(locator string) (joincode.Secret, []byte, error) {
				sec, err := joincode.NewCode(locator)
				return sec, []byte("record"), err
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		return sec
	}
	prove := func(sec *cluster.Secret, key string, v *cluster.TPMVerdict, require bool, facts wire.Facts) cluster.Outcome {
		t.Helper()
		att, err := c.BeginAttempt(ctx, sec.Locator)
		if err != nil {
			t.Fatal(err)
		}
		out, err := c.Prove(ctx, cluster.ProveRequest{
			Attempt: att, KeyFP: key, CurrentCA: "fp", Facts: facts, TPM: v, RequireTPM: require,
			NewNodeID: func() (string, error) { return fmt.Sprint("node-", n.Add(1)), nil },
			Issue: func(id, role string) (cluster.Cert, error) {
				return cluster.Cert{Serial: fmt.Sprint("serial-", n.Add(1)), NotAfter: time.Now().Add(time.Hour)}, nil
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	uses := func(sec *cluster.Secret) int {
		got, err := c.Secret(ctx, sec.ID)
		if err != nil {
			t.Fatal(err)
		}
		return got.Uses
	}
	ekA, ekB := strings.Repeat("a", 64), strings.Repeat("b", 64)
	tpmA, tpmB := &cluster.TPMVerdict{EKHash: ekA}, &cluster.TPMVerdict{EKHash: ekB}

	pinned := mint("jc-pinned", &cluster.Expect{EKHash: strings.ToUpper(ekA)})
	for name, v := range map[string]*cluster.TPMVerdict{"another TPM": tpmB, "no TPM": nil} {
		out := prove(pinned, "k1", v, false, wire.Facts{})
		if out.Code != wire.CodeIdentityMismatch || !strings.Contains(out.Message, "ekHash") || uses(pinned) != 0 {
			t.Fatalf("%s on an ekHash pin: %+v, %d uses", name, out, uses(pinned))
		}
	}
	out := prove(pinned, "k1", tpmA, false, wire.Facts{ProductUUID: "4c4c4544-0037-5810-804a-b2c04f4b5133"})
	if out.Status != wire.StatusJoined || out.Node.IdentityKey != "ek:"+ekA || out.Node.TPM == nil || uses(pinned) != 1 {
		t.Fatalf("the pinned TPM: %+v, %d uses", out, uses(pinned))
	}
	node := out.Node

	required := mint("jc-required", nil)
	if out := prove(required, "k2", nil, true, wire.Facts{}); out.Code != wire.CodeTPMRequired || uses(required) != 0 {
		t.Fatalf("requireTPM without a TPM: %+v, %d uses", out, uses(required))
	}
	// the same TPM claiming other hardware facts is the same node
	if out := prove(required, "k2", tpmA, true, wire.Facts{ProductUUID: "3b6e1c5a-8f2d-11ee-a1c4-7cc2554d9e30"}); out.Code != wire.CodeNodeExists || uses(required) != 0 {
		t.Fatalf("a second join of one TPM: %+v", out)
	}

	issue := func(id, role string) (cluster.Cert, error) {
		return cluster.Cert{Serial: fmt.Sprint("serial-", n.Add(1)), NotAfter: time.Now().Add(time.Hour)}, nil
	}
	if out, err := c.Renew(ctx, cluster.RenewRequest{NodeID: node.ID, Serial: node.CertSerial, KeyFP: "k-other", Issue: issue}); err != nil || out.Code != wire.CodeTPMKeyChanged {
		t.Fatalf("renewal into another key: %+v, %v", out, err)
	}
	if out, err := c.Renew(ctx, cluster.RenewRequest{NodeID: node.ID, Serial: node.CertSerial, KeyFP: "k1", Issue: issue}); err != nil || out.Status != wire.StatusJoined {
		t.Fatalf("renewal with the attested key: %+v, %v", out, err)
	}
}
