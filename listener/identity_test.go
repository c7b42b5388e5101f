package listener_test

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/stratumjoin/stratum/agent"
	"github.com/stratumjoin/stratum/hwid"
	"github.com/stratumjoin/stratum/internal/cluster"
	"github.com/stratumjoin/stratum/internal/joincode"
	"github.com/stratumjoin/stratum/internal/wire"
	"github.com/stratumjoin/stratum/listener"
	"github.com/stratumjoin/stratum/listener/adminapi"
	"github.com/stratumjoin/stratum/listener/adminclient"
	"github.com/stratumjoin/stratum/listener/listenertest"
	"github.com/stratumjoin/stratum/listener/registry"
)

// noGPUs stands in for NVML on machines the tests treat as GPU-less, so a
// test host with real GPUs does not change their facts.
type noGPUs struct{}

func (noGPUs) ProbeGPUs(context.Context) hwid.GPUResult { return hwid.GPUResult{} }

// machineFacts are what the agent claims on a testdata/sysfs machine: its
// DMI facts as hwid reads them below the tree, the given NICs (the test
// host's own links are not the machine's) and the GPUs gpus reports.
func machineFacts(t *testing.T, machine string, gpus hwid.GPUProber, macs ...string) wire.Facts {
	t.Helper()
	if gpus == nil {
		gpus = noGPUs{}
	}
	rep, err := hwid.Collect(context.Background(), hwid.Config{
		Root:     filepath.Join("..", "testdata", "sysfs", machine),
		GPUs:     gpus,
		Hostname: machine,
	})
	if err != nil {
		t.Fatalf("collect %s: %v", machine, err)
	}
	rep.Facts.MACs = macs
	return rep.Facts
}

// The DMI facts of the testdata machines, as their sysfs trees hold them.
const (
	dellUUIDInFile = "4c4c4544-0037-5810-804a-b2c04f4b5133" // as `cat product_uuid` prints it
	dellUUID       = "4C4C4544-0037-5810-804A-B2C04F4B5133" // as the agent reports it
	dellSerial     = "7XJ2KQ3"
	dgxUUID        = "3B6E1C5A-8F2D-11EE-A1C4-7CC2554D9E30"
	dgxSerial      = "1660423004819"
)

func dellFacts(t *testing.T) wire.Facts {
	t.Helper()
	f := machineFacts(t, "dell-r760", nil, "b0:7b:25:c1:00:10", "b0:7b:25:c1:00:11")
	if f.ProductUUID != dellUUID || f.Serial != dellSerial {
		t.Fatalf("precondition: dell-r760 claims uuid %q serial %q", f.ProductUUID, f.Serial)
	}
	return f
}

func dgxFacts(t *testing.T, gpus hwid.GPUProber) wire.Facts {
	t.Helper()
	f := machineFacts(t, "dgx-h100", gpus, "5c:25:73:3e:00:10")
	if f.ProductUUID != dgxUUID || f.Serial != dgxSerial {
		t.Fatalf("precondition: dgx-h100 claims uuid %q serial %q", f.ProductUUID, f.Serial)
	}
	return f
}

// pinCase is one code pinned with `expect`: the machine it names joins,
// another one is refused for the named field.
type pinCase struct {
	name   string
	expect cluster.Expect
	field  string // the field the wrong machine fails on
	right  wire.Facts
	wrong  wire.Facts
}

// checkPin mints a code with tc.expect, shows the wrong machine refused
// without spending anything, then the right one joining with it.
func checkPin(t *testing.T, tc pinCase) {
	t.Helper()
	ctx := context.Background()
	l := listenertest.Start(t, listenertest.Options{})
	sec, code := mint(t, l, adminapi.MintCodeRequest{AutoApprove: true, Expect: &tc.expect})

	_, _, err := join(t, l, sec, tc.wrong)
	var refused *agent.RefusedError
	if !errors.As(err, &refused) || refused.Code != wire.CodeIdentityMismatch {
		t.Fatalf("wrong machine: %v, want %s", err, wire.CodeIdentityMismatch)
	}
	if want := "this machine's " + tc.field + " is not the one the join code is pinned to"; !strings.Contains(refused.Message, want) {
		t.Errorf("refusal says %q, want it to say %q", refused.Message, want)
	}
	c, err := l.Admin.Code(ctx, code.ID)
	if err != nil {
		t.Fatal(err)
	}
	if c.Uses != 0 || c.Registrations != 0 || c.FailedAttempts != 0 || c.State != "live" {
		t.Fatalf("the refused join spent something: uses %d, registrations %d, failed attempts %d, state %s", c.Uses, c.Registrations, c.FailedAttempts, c.State)
	}
	evs, err := l.Admin.Events(ctx, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	ev, ok := findEvent(evs, cluster.EventJoinRefused, map[string]string{"secretId": code.ID})
	if !ok {
		t.Fatalf("no %s event for %s in %+v", cluster.EventJoinRefused, code.ID, evs)
	}
	if ev.Fields["field"] != tc.field || ev.Fields["code"] != wire.CodeIdentityMismatch {
		t.Errorf("refusal event fields %v, want field=%s code=%s", ev.Fields, tc.field, wire.CodeIdentityMismatch)
	}
	assertNoSecret(t, evs, sec)
	if nodes, _ := l.Admin.Nodes(ctx); len(nodes) != 0 {
		t.Fatalf("the refused machine became a node: %+v", nodes)
	}

	j, _, err := join(t, l, sec, tc.right)
	if err != nil {
		t.Fatalf("pinned machine: %v", err)
	}
	n, err := l.Admin.Node(ctx, j.Identity.NodeID)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(n.Facts.Wire(), tc.right) {
		t.Errorf("node claims\n %+v\nwant\n %+v", n.Facts, tc.right)
	}
	if !strings.Contains(n.FactsNote, "not attested") {
		t.Errorf("facts note %q does not say the facts are not attested", n.FactsNote)
	}
	if c, _ := l.Admin.Code(ctx, code.ID); c.Uses != 1 || c.Registrations != 1 {
		t.Errorf("after the pinned machine joined: uses %d, registrations %d", c.Uses, c.Registrations)
	}
}

func TestExpectPinsTheMachine(t *testing.T) {
	dell, dgx := dellFacts(t), dgxFacts(t, noGPUs{})
	withMACs := func(f wire.Facts, macs ...string) wire.Facts { f.MACs = macs; return f }
	withSerial := func(f wire.Facts, serial string) wire.Facts { f.Serial = serial; return f }
	for _, tc := range []pinCase{
		{
			name:   "product uuid, case-insensitive",
			expect: cluster.Expect{ProductUUID: dellUUIDInFile},
			field:  "productUuid", right: dell, wrong: dgx,
		},
		{
			name:   "serial",
			expect: cluster.Expect{Serial: dellSerial},
			field:  "serial", right: dell, wrong: dgx,
		},
		{
			// a serial is compared exactly: 7xj2kq3 is not 7XJ2KQ3
			name:   "serial, exact",
			expect: cluster.Expect{Serial: dellSerial},
			field:  "serial", right: dell, wrong: withSerial(dell, strings.ToLower(dellSerial)),
		},
		{
			name:   "mac, member of the set, case-insensitive",
			expect: cluster.Expect{MAC: "B0:7B:25:C1:00:11"},
			field:  "mac", right: dell, wrong: withMACs(dell, "b0:7b:25:c1:00:12"),
		},
		{
			// every field given must match, not just one
			name:   "every field given",
			expect: cluster.Expect{ProductUUID: dellUUID, Serial: dellSerial, MAC: "b0:7b:25:c1:00:10"},
			field:  "mac", right: dell, wrong: withMACs(dell, "b0:7b:25:c1:00:11"),
		},
	} {
		t.Run(tc.name, func(t *testing.T) { checkPin(t, tc) })
	}
}

// findEvent returns the first event of type typ whose fields include want.
func findEvent(evs []cluster.Event, typ string, want map[string]string) (cluster.Event, bool) {
next:
	for _, ev := range evs {
		if ev.Type != typ {
			continue
		}
		for k, v := range want {
			if ev.Fields[k] != v {
				continue next
			}
		}
		return ev, true
	}
	return cluster.Event{}, false
}

// assertNoSecret fails if any event carries the join code, in any spelling
// the agent or the admin could have used.
func assertNoSecret(t *testing.T, evs []cluster.Event, sec joincode.Secret) {
	t.Helper()
	b, err := json.Marshal(evs)
	if err != nil {
		t.Fatal(err)
	}
	all := strings.ToUpper(string(b))
	for _, form := range []string{sec.Display(), string(sec.Password())} {
		if strings.Contains(all, strings.ToUpper(form)) {
			t.Fatalf("an event carries the join code")
		}
	}
}

func TestNodeIdentity(t *testing.T) {
	dell := dellFacts(t)
	otherNICs := dell
	otherNICs.Serial, otherNICs.MACs, otherNICs.Hostname = "REPLACED-BOARD", []string{"b0:7b:25:c1:00:99"}, "renamed"
	const template = "03000200-0400-0500-0006-000700080009"
	tests := []struct {
		name          string
		first, second wire.Facts
		exists        bool
	}{
		{"product uuid decides, whatever else changed", dell, otherNICs, true},
		{"serial when there is no uuid", wire.Facts{Serial: "S452388X3A20165", MACs: []string{"3c:ec:ef:a1:b2:c3"}}, wire.Facts{Serial: "S452388X3A20165", MACs: []string{"3c:ec:ef:a1:b2:c4"}}, true},
		{"the mac set when there is neither", wire.Facts{MACs: []string{"3c:ec:ef:a1:b2:c3", "3c:ec:ef:a1:b2:c4"}}, wire.Facts{MACs: []string{"3C:EC:EF:A1:B2:C4", "3C:EC:EF:A1:B2:C3"}}, true},
		{"another mac set is another machine", wire.Facts{MACs: []string{"3c:ec:ef:a1:b2:c3"}}, wire.Facts{MACs: []string{"3c:ec:ef:a1:b2:c3", "3c:ec:ef:a1:b2:c4"}}, false},
		// boards that share the AMI template UUID are not one machine
		{"a placeholder uuid is no identity", wire.Facts{ProductUUID: template, MACs: []string{"3c:ec:ef:a1:b2:c3"}}, wire.Facts{ProductUUID: template, MACs: []string{"3c:ec:ef:a1:b2:c5"}}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := listenertest.Start(t, listenertest.Options{})
			sec, _ := mint(t, l, adminapi.MintCodeRequest{AutoApprove: true})
			first, _, err := join(t, l, sec, tt.first)
			if err != nil {
				t.Fatalf("first join: %v", err)
			}
			sec, code := mint(t, l, adminapi.MintCodeRequest{AutoApprove: true})
			_, _, err = join(t, l, sec, tt.second)
			var refused *agent.RefusedError
			switch {
			case tt.exists && (!errors.As(err, &refused) || refused.Code != wire.CodeNodeExists):
				t.Fatalf("second join: %v, want %s", err, wire.CodeNodeExists)
			case tt.exists && !strings.Contains(refused.Message, first.Identity.NodeID):
				t.Errorf("refusal %q does not name the node %s", refused.Message, first.Identity.NodeID)
			case !tt.exists && err != nil:
				t.Fatalf("second join: %v, want a new node", err)
			}
			c, _ := l.Admin.Code(context.Background(), code.ID)
			if want := map[bool]int{true: 0, false: 1}[tt.exists]; c.Uses != want {
				t.Errorf("second code's uses %d, want %d", c.Uses, want)
			}
		})
	}
}

// twoPools is an inventory with the default pool and another one.
const twoPools = `
tenants: [{id: default}]
sites: [{id: default, owner: platform}]
pools:
  - {id: default, tenant: default, site: default, agent: bcd}
  - {id: other, tenant: default, site: default, agent: bcd}
`

func TestSameMachineJoinsTwice(t *testing.T) {
	ctx := context.Background()
	reg, err := registry.Parse([]byte(twoPools))
	if err != nil {
		t.Fatal(err)
	}
	l := listenertest.Start(t, listenertest.Options{Config: listener.Config{Registry: reg}})
	dell := dellFacts(t)
	sec, _ := mint(t, l, adminapi.MintCodeRequest{AutoApprove: true})
	first, firstDir, err := join(t, l, sec, dell)
	if err != nil {
		t.Fatal(err)
	}
	nodeID := first.Identity.NodeID

	// a second key on the same machine (say, a reinstall) is refused
	sec, again := mint(t, l, adminapi.MintCodeRequest{AutoApprove: true})
	_, _, err = join(t, l, sec, dell)
	var refused *agent.RefusedError
	if !errors.As(err, &refused) || refused.Code != wire.CodeNodeExists {
		t.Fatalf("second join: %v, want %s", err, wire.CodeNodeExists)
	}
	if c, _ := l.Admin.Code(ctx, again.ID); c.Uses != 0 || c.State != "live" {
		t.Fatalf("NODE_EXISTS spent a use: %+v", c)
	}
	evs, _ := l.Admin.Events(ctx, "", 0)
	if _, ok := findEvent(evs, cluster.EventJoinRefused, map[string]string{"secretId": again.ID, "code": wire.CodeNodeExists, "nodeId": nodeID}); !ok {
		t.Errorf("no %s event naming %s for code %s", cluster.EventJoinRefused, nodeID, again.ID)
	}

	// identity is per pool
	sec, _ = mint(t, l, adminapi.MintCodeRequest{AutoApprove: true, Pool: "other"})
	if j, _, err := join(t, l, sec, dell); err != nil || j.Identity.NodeID == nodeID {
		t.Fatalf("same machine in another pool: %v (joined %+v)", err, j)
	}

	// the node renews once; its first certificate and key stay on a disk
	stale := copyState(t, firstDir)
	if _, err := agent.Renew(ctx, agent.RenewConfig{StateDir: firstDir}); err != nil {
		t.Fatal(err)
	}
	renewed, err := agent.State{Dir: firstDir}.Chain()
	if err != nil {
		t.Fatal(err)
	}

	// with allowReclaim the machine gets its node id back on a new key
	sec, reclaim := mint(t, l, adminapi.MintCodeRequest{AutoApprove: true, AllowReclaim: true})
	second, secondDir, err := join(t, l, sec, dell)
	if err != nil {
		t.Fatalf("reclaim: %v", err)
	}
	if second.Identity.NodeID != nodeID {
		t.Fatalf("reclaim gave node %s, want %s", second.Identity.NodeID, nodeID)
	}
	n, err := l.Admin.Node(ctx, nodeID)
	if err != nil {
		t.Fatal(err)
	}
	oldSerial := hex.EncodeToString(renewed[0].SerialNumber.Bytes())
	newSerial := hex.EncodeToString(second.Chain[0].SerialNumber.Bytes())
	if n.State != "active" || n.CertSerial != newSerial || !reflect.DeepEqual(n.RevokedSerials, []string{oldSerial}) {
		t.Fatalf("reclaimed node: state %s, serial %s, revoked %v; want active, %s, [%s]", n.State, n.CertSerial, n.RevokedSerials, newSerial, oldSerial)
	}
	evs, _ = l.Admin.Events(ctx, "", 0)
	if _, ok := findEvent(evs, cluster.EventNodeReclaimed, map[string]string{"nodeId": nodeID, "secretId": reclaim.ID}); !ok {
		t.Errorf("no %s event for %s", cluster.EventNodeReclaimed, nodeID)
	}

	// the old certificate is revoked: its renewal is refused
	_, err = agent.Renew(ctx, agent.RenewConfig{StateDir: firstDir})
	if !errors.As(err, &refused) || refused.Code != wire.CodeNodeRevoked {
		t.Fatalf("renewal with the reclaimed certificate: %v, want %s", err, wire.CodeNodeRevoked)
	}
	// and so is every certificate issued to the node before the reclaim
	_, err = agent.Renew(ctx, agent.RenewConfig{StateDir: stale})
	if !errors.As(err, &refused) || refused.Code != wire.CodeNodeRevoked {
		t.Fatalf("renewal with a certificate from before the last renewal: %v, want %s", err, wire.CodeNodeRevoked)
	}
	id, err := agent.Renew(ctx, agent.RenewConfig{StateDir: secondDir})
	if err != nil || id.NodeID != nodeID {
		t.Fatalf("renewal of the reclaiming key: %v (node %s)", err, id.NodeID)
	}
	// and stays refused once the new key has renewed
	if _, err := agent.Renew(ctx, agent.RenewConfig{StateDir: firstDir}); !errors.As(err, &refused) || refused.Code != wire.CodeNodeRevoked {
		t.Fatalf("second renewal with the reclaimed certificate: %v", err)
	}
	if nodes, _ := l.Admin.Nodes(ctx); len(nodes) != 2 {
		t.Fatalf("%d nodes, want 2 (one per pool)", len(nodes))
	}
}

// copyState copies an agent state directory, as a disk image of the
// machine would keep it.
func copyState(t *testing.T, dir string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "copy")
	if err := os.Mkdir(dst, 0o700); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

func TestMintRefusesBadExpect(t *testing.T) {
	l := listenertest.Start(t, listenertest.Options{})
	tests := []struct {
		name   string
		expect cluster.Expect
		field  string
	}{
		{"empty", cluster.Expect{}, "expect"},
		{"uuid not hex", cluster.Expect{ProductUUID: "not-a-uuid"}, "expect.productUuid"},
		{"uuid too short", cluster.Expect{ProductUUID: "4c4c45"}, "expect.productUuid"},
		{"uuid too long", cluster.Expect{ProductUUID: strings.Repeat("4c4c4544-", 8)}, "expect.productUuid"},
		{"uuid all zeros", cluster.Expect{ProductUUID: "00000000-0000-0000-0000-000000000000"}, "expect.productUuid"},
		{"uuid all F", cluster.Expect{ProductUUID: "FFFFFFFF-FFFF-FFFF-FFFF-FFFFFFFFFFFF"}, "expect.productUuid"},
		{"uuid AMI template", cluster.Expect{ProductUUID: "03000200-0400-0500-0006-000700080009"}, "expect.productUuid"},
		{"serial with spaces", cluster.Expect{Serial: "To Be Filled By O.E.M."}, "expect.serial"},
		{"serial too long", cluster.Expect{Serial: strings.Repeat("7", 129)}, "expect.serial"},
		{"serial placeholder", cluster.Expect{Serial: "0123456789"}, "expect.serial"},
		{"serial placeholder without spaces", cluster.Expect{Serial: "DefaultString"}, "expect.serial"},
		{"mac with dashes", cluster.Expect{MAC: "02-aa-bb-cc-dd-01"}, "expect.mac"},
		{"mac too short", cluster.Expect{MAC: "02:aa:bb:cc:dd"}, "expect.mac"},
		{"mac all zeros", cluster.Expect{MAC: "00:00:00:00:00:00"}, "expect.mac"},
		{"mac broadcast", cluster.Expect{MAC: "ff:ff:ff:ff:ff:ff"}, "expect.mac"},
		{"mac multicast", cluster.Expect{MAC: "01:00:5e:00:00:fb"}, "expect.mac"},
		{"gpu without GPU-", cluster.Expect{GPUUUID: "8c8e2d4a-5b7f-1e3c-9d0a-6f1b2c3d4e5f"}, "expect.gpuUuid"},
		{"gpu all zeros", cluster.Expect{GPUUUID: "GPU-00000000-0000-0000-0000-000000000000"}, "expect.gpuUuid"},
		// one bad field spoils a binding whose other fields are fine
		{"good uuid, bad mac", cluster.Expect{ProductUUID: dellUUID, MAC: "b0:7b:25:c1:00"}, "expect.mac"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := l.Admin.MintCode(context.Background(), adminapi.MintCodeRequest{AutoApprove: true, Expect: &tt.expect})
			var prob *adminclient.ProblemError
			if !errors.As(err, &prob) || prob.Code != adminapi.CodeInvalidInput {
				t.Fatalf("mint: %v, want %s", err, adminapi.CodeInvalidInput)
			}
			if len(prob.Errors) != 1 || prob.Errors[0].Field != tt.field || prob.Errors[0].Message == "" {
				t.Fatalf("field errors %+v, want one for %s", prob.Errors, tt.field)
			}
		})
	}
	if codes, err := l.Admin.Codes(context.Background()); err != nil || len(codes) != 0 {
		t.Fatalf("refused mints left codes: %v %+v", err, codes)
	}
}
