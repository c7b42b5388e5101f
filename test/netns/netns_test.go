package netns

import (
	"encoding/json"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// join runs `stratum-agent join` in the agent namespace with the code on
// stdin, a fresh state directory and the given hwid flags.
func (n *network) join(t *testing.T, c code, hwidFlags ...string) result {
	t.Helper()
	state := filepath.Join(t.TempDir(), "state")
	args := append([]string{"join", "--endpoint", endpoint, "--code", "-", "--state", state, "--json"}, hwidFlags...)
	return runIn(t, n.AgentNS, nil, c.Code+"\n", "stratum-agent", args...)
}

// joinedNode is the node id a successful `join --json` printed.
func joinedNode(t *testing.T, r result) string {
	t.Helper()
	if r.exit != 0 {
		t.Fatalf("join: %s", r)
	}
	var id struct {
		NodeID string `json:"nodeId"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &id); err != nil || id.NodeID == "" {
		t.Fatalf("join printed no node id (%v):\n%s", err, r.stdout)
	}
	return id.NodeID
}

// refusedFor checks that a join was refused for good because the machine
// is not the one the code is pinned to, naming field.
func refusedFor(t *testing.T, r result, field string) {
	t.Helper()
	want := "this machine's " + field + " is not the one the join code is pinned to"
	if r.exit != 1 || !strings.Contains(r.stderr, want) {
		t.Fatalf("join of the wrong machine: want exit 1 and %q; got %s", want, r)
	}
}

// unspent checks that a code has spent no use and no attempt.
func unspent(t *testing.T, l *listenerProc, id string) {
	t.Helper()
	var c code
	l.adminJSON(&c, "codes", "show", id)
	if c.Uses != 0 || c.Registrations != 0 || c.FailedAttempts != 0 || c.State != "live" {
		t.Fatalf("code %s after the refusal: uses %d, registrations %d, failed attempts %d, state %s", id, c.Uses, c.Registrations, c.FailedAttempts, c.State)
	}
}

// hwidReport is the part of `stratum-agent hwid --json` these tests read.
type hwidReport struct {
	Facts claimedFacts `json:"facts"`
	Notes []string     `json:"notes"`
}

func (n *network) hwid(t *testing.T, flags ...string) hwidReport {
	t.Helper()
	r := runIn(t, n.AgentNS, nil, "", "stratum-agent", append([]string{"hwid", "--json"}, flags...)...)
	if r.exit != 0 {
		t.Fatalf("hwid %v: %s", flags, r)
	}
	var rep hwidReport
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("hwid --json: %v\n%s", err, r.stdout)
	}
	return rep
}

func TestJoinPinnedToMAC(t *testing.T) {
	n := newNetwork(t)
	l := startListener(t, n)
	empty := t.TempDir() // a machine without DMI: its NIC is all that identifies it
	var outputs []string

	// A veth is made by software, so it is no identity unless the operator
	// names it: --nic is what makes this test machine's link count.
	n.SetAgentMAC(t, "02:aa:bb:cc:dd:02")
	if rep := n.hwid(t, "--root", empty); len(rep.Facts.MACs) != 0 || !slices.ContainsFunc(rep.Notes, func(s string) bool { return strings.Contains(s, n.AgentIf+" (veth)") }) {
		t.Fatalf("without --nic the agent claims MACs %v (notes %q); a veth is not a NIC", rep.Facts.MACs, rep.Notes)
	}
	if rep := n.hwid(t, "--root", empty, "--nic", n.AgentIf); !reflect.DeepEqual(rep.Facts.MACs, []string{"02:aa:bb:cc:dd:02"}) {
		t.Fatalf("with --nic %s the agent claims MACs %v", n.AgentIf, rep.Facts.MACs)
	}

	var c code
	l.adminJSON(&c, "codes", "create", "--auto-approve", "--max-uses", "1", "--expect-mac", "02:AA:BB:CC:DD:01")
	if c.Code == "" || !strings.Contains(string(c.Expect), "02:AA:BB:CC:DD:01") {
		t.Fatalf("minted %+v", c)
	}

	// another machine: refused for good, nothing spent
	r := n.join(t, c, "--root", empty, "--nic", n.AgentIf)
	outputs = append(outputs, r.stdout, r.stderr)
	refusedFor(t, r, "mac")
	unspent(t, l, c.ID)

	// the machine the code is pinned to
	n.SetAgentMAC(t, "02:aa:bb:cc:dd:01")
	r = n.join(t, c, "--root", empty, "--nic", n.AgentIf)
	outputs = append(outputs, r.stdout, r.stderr)
	id := joinedNode(t, r)
	var nd node
	l.adminJSON(&nd, "nodes", "show", id)
	if !reflect.DeepEqual(nd.ClaimedFacts.MACs, []string{"02:aa:bb:cc:dd:01"}) || !strings.Contains(nd.FactsNote, "not attested") {
		t.Fatalf("node %s claims MACs %v, facts note %q", id, nd.ClaimedFacts.MACs, nd.FactsNote)
	}
	text := l.admin("nodes", "show", id)
	if text.exit != 0 || !strings.Contains(text.stdout, "claimed by the machine at join, not attested") || !strings.Contains(text.stdout, "02:aa:bb:cc:dd:01") {
		t.Fatalf("nodes show does not list the MAC as claimed, not attested: %s", text)
	}
	var after code
	l.adminJSON(&after, "codes", "show", c.ID)
	if after.Uses != 1 || after.Registrations != 1 {
		t.Fatalf("code after the join: %+v", after)
	}

	// the refusal is an event that names the field
	ev := l.admin("events", "--json")
	refusal := false
	for line := range strings.Lines(ev.stdout) {
		var e struct {
			Type   string         `json:"type"`
			Fields map[string]any `json:"fields"`
		}
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("events --json line %q: %v", line, err)
		}
		refusal = refusal || (e.Type == "join.refused" && e.Fields["field"] == "mac" && e.Fields["secretId"] == c.ID)
	}
	if !refusal {
		t.Fatalf("no join.refused event naming the mac:\n%s", ev)
	}

	// the code never shows up outside the answer that minted it
	outputs = append(outputs, ev.stdout, text.stdout, l.stderr.String())
	for _, out := range outputs {
		upper := strings.ToUpper(out)
		if strings.Contains(upper, c.Code) || strings.Contains(upper, strings.ReplaceAll(c.Code, "-", "")) {
			t.Fatalf("the join code appears in an output or log:\n%s", out)
		}
	}
}

func TestJoinPinnedWithRoot(t *testing.T) {
	n := newNetwork(t)
	l := startListener(t, n)
	machine := func(name string) string {
		p, err := filepath.Abs(filepath.Join("..", "..", "testdata", "sysfs", name))
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	dell, dgx := machine("dell-r760"), machine("dgx-h100")

	// product UUID as the operator copies it from sysfs (lower case);
	// the agent reports it upper case
	var byUUID code
	l.adminJSON(&byUUID, "codes", "create", "--auto-approve", "--max-uses", "1", "--expect-product-uuid", "4c4c4544-0037-5810-804a-b2c04f4b5133")
	refusedFor(t, n.join(t, byUUID, "--root", dgx), "productUuid")
	unspent(t, l, byUUID.ID)
	id := joinedNode(t, n.join(t, byUUID, "--root", dell))
	var nd node
	l.adminJSON(&nd, "nodes", "show", id)
	if nd.ClaimedFacts.ProductUUID != "4C4C4544-0037-5810-804A-B2C04F4B5133" || nd.ClaimedFacts.Serial != "7XJ2KQ3" {
		t.Fatalf("node %s claims %+v", id, nd.ClaimedFacts)
	}

	// a GPU pin on a machine without that GPU (the agent loads NVML at
	// run time; without the library it has no GPUs at all)
	var byGPU code
	l.adminJSON(&byGPU, "codes", "create", "--auto-approve", "--max-uses", "1", "--expect-gpu-uuid", "GPU-8c8e2d4a-5b7f-1e3c-9d0a-6f1b2c3d4e5f")
	refusedFor(t, n.join(t, byGPU, "--root", dell), "gpuUuid")
	unspent(t, l, byGPU.ID)

	// the same machine again, by serial: it is already a node
	var bySerial code
	l.adminJSON(&bySerial, "codes", "create", "--auto-approve", "--max-uses", "1", "--expect-serial", "7XJ2KQ3")
	refusedFor(t, n.join(t, bySerial, "--root", dgx), "serial")
	r := n.join(t, bySerial, "--root", dell)
	if r.exit != 1 || !strings.Contains(r.stderr, "already joined ("+id+")") {
		t.Fatalf("the same machine joining again: want exit 1 naming %s; got %s", id, r)
	}
	unspent(t, l, bySerial.ID)

	// unless the code allows reclaim: the node id is kept
	var reclaim code
	l.adminJSON(&reclaim, "codes", "create", "--auto-approve", "--max-uses", "1", "--expect-serial", "7XJ2KQ3", "--allow-reclaim")
	if !reclaim.AllowReclaim {
		t.Fatalf("--allow-reclaim minted %+v", reclaim)
	}
	if got := joinedNode(t, n.join(t, reclaim, "--root", dell)); got != id {
		t.Fatalf("reclaim joined as %s, want %s", got, id)
	}
}

func TestMintRefusesBadPins(t *testing.T) {
	n := newNetwork(t)
	l := startListener(t, n)
	// a usage error (2) that names the flag, not the API field
	for _, tc := range []struct{ flag, value, field string }{
		{"--expect-mac", "00:00:00:00:00:00", "expect.mac"},
		{"--expect-mac", "02-aa-bb-cc-dd-01", "expect.mac"},
		{"--expect-product-uuid", "03000200-0400-0500-0006-000700080009", "expect.productUuid"},
		{"--expect-serial", "To Be Filled By O.E.M.", "expect.serial"},
		{"--expect-gpu-uuid", "GPU-00000000-0000-0000-0000-000000000000", "expect.gpuUuid"},
	} {
		r := l.admin("codes", "create", "--auto-approve", tc.flag, tc.value)
		if r.exit != 2 || !strings.Contains(r.stderr, tc.flag+":") || strings.Contains(r.stderr, tc.field) {
			t.Errorf("codes create %s %q: want exit 2 naming %s, not %s; got %s", tc.flag, tc.value, tc.flag, tc.field, r)
		}
	}
	var list struct {
		Items []code `json:"items"`
	}
	l.adminJSON(&list, "codes", "list", "--all")
	if len(list.Items) != 0 {
		t.Fatalf("refused mints left codes: %+v", list.Items)
	}
}
