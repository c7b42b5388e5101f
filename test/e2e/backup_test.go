package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sync"
	"testing"
	"time"
)

// copyKeys copies a data directory's keys and settings (never in the
// store, so never in a backup) into a new data directory.
func copyKeys(t *testing.T, from, to string) {
	t.Helper()
	out, err := exec.Command("cp", "-a", filepath.Join(from, "keys"), filepath.Join(from, "listener.json"), to).CombinedOutput()
	if err != nil {
		t.Fatalf("copy keys: %v\n%s", err, out)
	}
}

// restored starts a listener on a new data directory holding backup.
func restored(t *testing.T, from *listenerProc, backup string) *listenerProc {
	t.Helper()
	sockDir, err := os.MkdirTemp("/tmp", "sje2e")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	p := &listenerProc{t: t, data: filepath.Join(t.TempDir(), "restored"), sock: filepath.Join(sockDir, "admin.sock"), endpoint: freeUDP(t)}
	if err := os.MkdirAll(p.data, 0o700); err != nil {
		t.Fatal(err)
	}
	copyKeys(t, from.data, p.data)
	run(t, nil, "stratum-listener", "store", "restore", backup, "--data", p.data)
	p.start()
	t.Cleanup(p.stop)
	return p
}

type listing struct {
	Codes []json.RawMessage
	Nodes []json.RawMessage
}

func listings(p *listenerProc) listing {
	var codes, nodes struct{ Items []json.RawMessage }
	p.adminJSON(&codes, "codes", "list", "--all")
	p.adminJSON(&nodes, "nodes", "list")
	return listing{codes.Items, nodes.Items}
}

// TestBackupDuringJoinStorm: `store backup` while twenty agents join
// gives a file that checks and restores into a new data directory; the
// restored listener's listing is a consistent state (the code's uses are
// its nodes), and a backup taken once the storm is over restores to
// listings equal to the live ones.
func TestBackupDuringJoinStorm(t *testing.T) {
	// the storm comes from one address: lift its budget
	l := newListenerServe(t, []string{"--unproven-per-source=-1"})
	var code mintedCode
	l.adminJSON(&code, "codes", "create", "--auto-approve", "--max-uses", "0")
	dir := t.TempDir()
	var wg sync.WaitGroup
	errs := make(chan string, 20)
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := agentJoin(context.Background(), l.endpoint, code.Code, filepath.Join(dir, fmt.Sprint("state", i)), "--root", machineRoot(t, dir, i))
			if r.exit != 0 {
				errs <- r.stderr
			}
		}()
	}
	// back up once the storm is under way
	deadline := time.Now().Add(60 * time.Second)
	for l.code(code.ID).Uses < 3 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	mid := filepath.Join(dir, "mid.db")
	if _, err := l.admin("store", "backup", mid); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Errorf("a join failed: %s", e)
	}
	if out, err := l.admin("store", "check", mid); err != nil {
		t.Fatalf("store check of the mid-storm backup: %v %s", err, out)
	}
	fi, err := os.Stat(mid)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("backup file: %v %v, want 0600", fi.Mode(), err)
	}

	m := restored(t, l, mid)
	var c mintedCode
	m.adminJSON(&c, "codes", "show", code.ID)
	var nodes struct{ Items []json.RawMessage }
	m.adminJSON(&nodes, "nodes", "list")
	t.Logf("mid-storm backup: %d uses, %d nodes", c.Uses, len(nodes.Items))
	if c.Uses != len(nodes.Items) || c.Registrations != len(nodes.Items) {
		t.Fatalf("mid-storm backup is not one state: %d uses, %d registrations, %d nodes", c.Uses, c.Registrations, len(nodes.Items))
	}
	m.stop()

	after := filepath.Join(dir, "after.db")
	if _, err := l.admin("store", "backup", after); err != nil {
		t.Fatal(err)
	}
	live := listings(l)
	a := restored(t, l, after)
	if got := listings(a); !reflect.DeepEqual(got, live) {
		t.Fatalf("restored listings differ from the live ones:\n%s\n%s", got, live)
	}
	if len(live.Nodes) != 20 {
		t.Fatalf("%d nodes, want 20", len(live.Nodes))
	}
	// restore refuses a data directory that has a store already
	if out, err := exec.Command(filepath.Join(binDir, "stratum-listener"), "store", "restore", after, "--data", a.data).CombinedOutput(); err == nil {
		t.Fatalf("restore over an existing store: %s", out)
	}
}
