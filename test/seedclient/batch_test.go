package seedclient_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// pendingLine is what `stratum-agent join` prints on stderr while the
// listener holds its join for approval.
var pendingLine = regexp.MustCompile(`join (join-[0-9a-z]+) waits for approval; its SAS is ([0-9]{6})`)

type machine struct {
	tree, state string
	cmd         *exec.Cmd
	stdout      bytes.Buffer
	joinID, sas string
	done        chan error
}

// TestBatchCodeThreeMachines: one join code minted over HTTPS with the
// defaults joins three machines (SMBIOS trees from testdata). Each join is
// held until approved; the SAS each agent prints (stderr and `status
// --json`) is the one the API and `joins list` show for its join; an
// approval with a wrong SAS, through the CLI and through the API, is
// refused and the join stays pending; the right one lets it through.
func TestBatchCodeThreeMachines(t *testing.T) {
	c := start(t)
	var key struct {
		Key string `json:"key"`
	}
	if err := json.Unmarshal(c.cli(t, "apikeys", "create", "--json", "--tenant", "acme", "--name", "approver",
		"--grant", "ha:CreateJoinCode@cluster", "--grant", "ha:DescribeJoinCodes@cluster",
		"--grant", "ha:DescribeNodeJoins@cluster", "--grant", "ha:ApproveNodeJoin@cluster", "--grant", "ha:RefuseNodeJoin@cluster"), &key); err != nil {
		t.Fatal(err)
	}
	status, code := c.call(t, key.Key, "POST", "/v1/admin/cluster/join-codes", `{"pool":"pool-a"}`)
	if status != 201 || code["requireApproval"] != true || code["maxUses"] != 0.0 {
		t.Fatalf("mint with defaults: %d %v", status, code)
	}
	secret := code["code"].(string)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	root := repoRoot(t)
	var ms []*machine
	found := make(chan *machine, 3)
	for _, tree := range []string{"dell-r760", "dgx-h100", "supermicro-gpu"} {
		m := &machine{tree: filepath.Join(root, "testdata", "sysfs", tree), state: filepath.Join(t.TempDir(), "state"), done: make(chan error, 1)}
		m.cmd = exec.CommandContext(ctx, filepath.Join(c.bin, "stratum-agent"), "join", "--json",
			"--endpoint", c.endpoint, "--code", "-", "--state", m.state, "--root", m.tree)
		m.cmd.Stdin = strings.NewReader(secret + "\n")
		m.cmd.Stdout = &m.stdout
		stderr, err := m.cmd.StderrPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := m.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() {
			sc := bufio.NewScanner(stderr)
			for sc.Scan() {
				if g := pendingLine.FindStringSubmatch(sc.Text()); g != nil && m.joinID == "" {
					m.joinID, m.sas = g[1], g[2]
					found <- m
				}
			}
			m.done <- m.cmd.Wait()
		}()
		ms = append(ms, m)
	}
	for range ms {
		select {
		case <-found:
		case <-ctx.Done():
			t.Fatalf("not every agent printed a pending join and its SAS:\n%s", c.logs.String())
		}
	}

	// the agent's status --json shows the same digits while it waits
	for _, m := range ms {
		out, err := exec.Command(filepath.Join(c.bin, "stratum-agent"), "status", "--json", "--state", m.state).Output()
		var st struct {
			Joined  bool `json:"joined"`
			Pending struct {
				JoinID string `json:"joinId"`
				SAS    string `json:"sas"`
				Kind   string `json:"kind"`
			} `json:"pending"`
		}
		if err != nil || json.Unmarshal(out, &st) != nil || st.Joined || st.Pending.JoinID != m.joinID || st.Pending.SAS != m.sas || st.Pending.Kind != "join code" {
			t.Fatalf("%s: status --json %s (%v)", m.tree, out, err)
		}
	}

	// the API and the CLI list each pending join with its agent's SAS
	status, list := c.call(t, key.Key, "GET", "/v1/admin/cluster/joins", "")
	var cliList struct {
		Items []struct{ ID, State, SAS string } `json:"items"`
	}
	if err := json.Unmarshal(c.cli(t, "joins", "list", "--json"), &cliList); err != nil {
		t.Fatal(err)
	}
	listedSAS := map[string]string{}
	for _, it := range list["items"].([]any) {
		j := it.(map[string]any)
		if j["state"] != "pending" {
			t.Fatalf("join %v is %v before any approval", j["id"], j["state"])
		}
		listedSAS[j["id"].(string)] = j["sas"].(string)
	}
	if status != 200 || len(listedSAS) != 3 || len(cliList.Items) != 3 {
		t.Fatalf("joins: %d, %d over HTTPS, %d in the CLI", status, len(listedSAS), len(cliList.Items))
	}
	for _, it := range cliList.Items {
		if listedSAS[it.ID] != it.SAS {
			t.Fatalf("join %s: CLI SAS %s, API %s", it.ID, it.SAS, listedSAS[it.ID])
		}
	}
	for _, m := range ms {
		if listedSAS[m.joinID] != m.sas {
			t.Fatalf("%s printed SAS %s for %s; listed %q", m.tree, m.sas, m.joinID, listedSAS[m.joinID])
		}
	}
	wrong := func(sas string) string { return strings.Map(func(r rune) rune { return '0' + (r-'0'+1)%10 }, sas) }
	stillPending := func(m *machine) {
		t.Helper()
		status, j := c.call(t, key.Key, "GET", "/v1/admin/cluster/joins/"+m.joinID, "")
		if status != 200 || j["state"] != "pending" || j["sas"] != m.sas {
			t.Fatalf("after a refused approval %s is %d %v", m.joinID, status, j)
		}
	}

	// machine 0: the CLI refuses a wrong SAS, then approves the right one
	cmd := exec.Command(filepath.Join(c.bin, "stratum-listener"), "joins", "approve", ms[0].joinID, "--sas", wrong(ms[0].sas))
	cmd.Env = c.env
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "JOIN_APPROVAL_REFUSED") {
		t.Fatalf("joins approve with a wrong SAS: %v\n%s", err, out)
	}
	stillPending(ms[0])
	c.cli(t, "joins", "approve", ms[0].joinID, "--sas", ms[0].sas)

	// machine 1: the API refuses a wrong SAS in problem+json, then approves
	status, p := c.call(t, key.Key, "POST", "/v1/admin/cluster/joins/"+ms[1].joinID+"/approve", `{"sas":"`+wrong(ms[1].sas)+`"}`)
	errs, _ := p["errors"].([]any)
	if status != 409 || p["code"] != "JOIN_APPROVAL_REFUSED" || len(errs) == 0 || errs[0].(map[string]any)["field"] != "sas" {
		t.Fatalf("approve with a wrong SAS: %d %v", status, p)
	}
	stillPending(ms[1])
	for _, m := range ms[1:] {
		if status, j := c.call(t, key.Key, "POST", "/v1/admin/cluster/joins/"+m.joinID+"/approve", `{"sas":"`+m.sas+`"}`); status != 200 || j["state"] != "approved" {
			t.Fatalf("approve %s: %d %v", m.joinID, status, j)
		}
	}

	nodes := map[string]bool{}
	for _, m := range ms {
		select {
		case err := <-m.done:
			var id struct {
				NodeID string `json:"nodeId"`
			}
			if err != nil || json.Unmarshal(m.stdout.Bytes(), &id) != nil || id.NodeID == "" {
				t.Fatalf("%s: %v\n%s", m.tree, err, m.stdout.String())
			}
			nodes[id.NodeID] = true
		case <-ctx.Done():
			t.Fatalf("%s did not finish after approval", m.tree)
		}
	}
	status, after := c.call(t, key.Key, "GET", "/v1/admin/cluster/join-codes/"+code["id"].(string), "")
	if len(nodes) != 3 || status != 200 || after["registrations"] != 3.0 || after["state"] != "live" {
		t.Fatalf("%d nodes; the code after the batch: %d %v", len(nodes), status, after)
	}
}
