package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stratumjoin/stratum/internal/store/etcdtest"
)

// outageBound bounds how long an answer may take once the store is cut
// off; the store deadline is 2 s here, and before deadlines agents waited
// 90 s and `codes list` over two minutes. It only bounds a wait for an
// answer that must come.
const outageBound = 30 * time.Second

// TestEtcdPartitionAndQuorumLoss runs the listener on three real etcd
// processes, reaching one member. With that member partitioned from its
// peers, and then with two members killed, agents are refused
// JOIN_UNAVAILABLE ("cannot reach its store") and exit 3, and `codes list`
// exits 3 saying so, each within the bound. Healed, every join goes
// through and nothing was lost.
func TestEtcdPartitionAndQuorumLoss(t *testing.T) {
	procs := etcdtest.StartProcs(t, 3)
	m0 := procs.Members[0]
	storeURL := "etcd://" + strings.TrimPrefix(m0.ClientURL, "http://") + "/stratum-e2e"

	sockDir, err := os.MkdirTemp("/tmp", "sje2e")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	l := &listenerProc{t: t, data: filepath.Join(t.TempDir(), "listener"), sock: filepath.Join(sockDir, "admin.sock"), endpoint: freeUDP(t),
		serveArgs: []string{"--store", storeURL, "--store-timeout", "2s"}}
	run(t, nil, "stratum-listener", "init", "--data", l.data, "--light-ksf", "--endpoint", l.endpoint)
	l.start()
	t.Cleanup(l.stop)

	var code mintedCode
	l.adminJSON(&code, "codes", "create", "--auto-approve", "--max-uses", "0")
	dir := t.TempDir()
	ctx := context.Background()
	join := func(i int) agentResult {
		return agentJoin(ctx, l.endpoint, code.Code, filepath.Join(dir, "state", string(rune('a'+i))), "--root", machineRoot(t, dir, i))
	}
	if r := join(0); r.exit != 0 {
		t.Fatalf("join before the faults: %+v", r)
	}

	outage := func(name string, i int) {
		t.Helper()
		start := time.Now()
		r := join(i)
		took := time.Since(start)
		t.Logf("%s: join exit %d after %v: %s", name, r.exit, took, strings.TrimSpace(r.stderr))
		if r.exit != 3 || !strings.Contains(r.stderr, "cannot reach its store") || took > outageBound {
			t.Errorf("%s: join exit %d after %v: %s; want exit 3, the store named", name, r.exit, took, r.stderr)
		}
		start = time.Now()
		out, err := l.admin("codes", "list")
		took = time.Since(start)
		t.Logf("%s: codes list after %v: %v", name, took, err)
		if err == nil || !strings.Contains(err.Error(), "exit status 3") || !strings.Contains(err.Error(), "cannot reach its store") || took > outageBound {
			t.Errorf("%s: codes list after %v: %v %s; want exit 3, the store named", name, took, err, out)
		}
	}

	// Cut the member the listener reaches off from its peers: stop all
	// peer traffic (etcd's streams are dialed by the receiving side, its
	// pipeline by the sending one, so cutting one member's proxy leaves
	// a path). Wait until a write through m0 no longer succeeds (a leader
	// notices only after an election timeout).
	for _, m := range procs.Members {
		m.Partition()
	}
	cli := procs.Client(t, m0)
	deadline := time.Now().Add(30 * time.Second)
	for {
		wctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := cli.Put(wctx, "/probe", "x")
		cancel()
		if err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("writes through the cut-off member still succeed")
		}
		time.Sleep(100 * time.Millisecond)
	}
	outage("partitioned", 1)
	for _, m := range procs.Members {
		m.Heal()
	}
	procs.WaitHealthy(t, m0, 60*time.Second)
	if r := join(1); r.exit != 0 {
		t.Fatalf("join after the partition healed: %+v", r)
	}

	procs.Members[1].Kill()
	procs.Members[2].Kill()
	outage("out of quorum", 2)
	for _, m := range procs.Members[1:] {
		if err := m.Start(); err != nil {
			t.Fatal(err)
		}
	}
	procs.WaitHealthy(t, m0, 60*time.Second)
	if r := join(2); r.exit != 0 {
		t.Fatalf("join after quorum returned: %+v", r)
	}

	got := l.code(code.ID)
	var nodes struct{ Items []any }
	l.adminJSON(&nodes, "nodes", "list")
	if got.Uses != 3 || len(nodes.Items) != 3 || got.FailedAttempts != 0 || got.State != "live" {
		t.Fatalf("after the faults: %+v, %d nodes; want 3 uses, 3 nodes, 0 failed attempts", got, len(nodes.Items))
	}
}
