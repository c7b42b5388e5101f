package listener_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stratumjoin/stratum/agent"
	"github.com/stratumjoin/stratum/internal/testenv"
	"github.com/stratumjoin/stratum/internal/wire"
	"github.com/stratumjoin/stratum/listener"
	"github.com/stratumjoin/stratum/listener/adminapi"
	"github.com/stratumjoin/stratum/listener/adminclient"
	"github.com/stratumjoin/stratum/listener/listenertest"
)

// smallTmpfs mounts a tmpfs of size bytes for the test (root: see
// testenv).
func smallTmpfs(t *testing.T, size int) string {
	t.Helper()
	testenv.NeedRoot(t, "mount a small tmpfs")
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d,mode=0700", size), "tmpfs", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount tmpfs: %v\n%s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", dir).Run() })
	return dir
}

// fill writes to path until the file system is full.
func fill(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4096)
	for {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			return
		}
	}
}

// TestFullDiskCostsNoAttempt: the store's disk fills during a wave of
// honest joins. Every agent either joins or is told, retryably, that the
// listener's store is out of disk space; once space returns they all
// join, and the code has gained no failed attempt.
func TestFullDiskCostsNoAttempt(t *testing.T) {
	disk := smallTmpfs(t, 2<<20)
	l := listenertest.Start(t, listenertest.Options{Config: listener.Config{StoreURL: "bolt:" + filepath.Join(disk, "state.db"), UnprovenPerSource: -1}})
	unlimited := 0
	sec, code := mint(t, l, adminapi.MintCodeRequest{AutoApprove: true, MaxUses: &unlimited})
	fill(t, filepath.Join(disk, "filler"))
	// leave room for a few small writes, so that some counts succeed and
	// the larger write of their join fails after them (here about a third
	// of the refused joins had been counted)
	fi, err := os.Stat(filepath.Join(disk, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(filepath.Join(disk, "filler"), fi.Size()-16<<10); err != nil {
		t.Fatal(err)
	}

	states := t.TempDir()
	joinAs := func(i int) error {
		_, err := agent.Join(context.Background(), agent.JoinConfig{
			StateDir: filepath.Join(states, fmt.Sprint(i)), Endpoint: l.Endpoint, Secret: sec,
			Facts: wire.Facts{ProductUUID: fmt.Sprintf("4c4c4544-0000-4000-8000-%012d", 2000+i)},
		})
		return err
	}
	var waiting []int
	for i := range 20 {
		err := joinAs(i)
		var refused *agent.RefusedError
		switch {
		case err == nil:
		case errors.As(err, &refused) && refused.Code == wire.CodeUnavailable && strings.Contains(refused.Message, "disk space"):
			waiting = append(waiting, i)
		default:
			t.Fatalf("join %d on a full disk: %v", i, err)
		}
	}
	during, err := l.Admin.Code(context.Background(), code.ID)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d of 20 joins were told the disk is full; %d attempts counted meanwhile", len(waiting), during.FailedAttempts)
	if len(waiting) == 0 {
		t.Fatal("no join met the full disk")
	}

	// the admin API names the full disk too, as a retryable 503
	fill(t, filepath.Join(disk, "filler2"))
	_, err = l.Admin.MintCode(context.Background(), adminapi.MintCodeRequest{AutoApprove: true})
	var p *adminclient.ProblemError
	if !errors.As(err, &p) || !p.Transient() || !strings.Contains(p.Detail, "disk space") {
		t.Errorf("codes create on a full disk: %v, want a 503 that names the disk", err)
	}
	os.Remove(filepath.Join(disk, "filler2"))

	if err := os.Remove(filepath.Join(disk, "filler")); err != nil {
		t.Fatal(err)
	}
	for _, i := range waiting {
		if err := joinAs(i); err != nil {
			t.Errorf("join %d once space returned: %v", i, err)
		}
	}
	c, err := l.Admin.Code(context.Background(), code.ID)
	if err != nil {
		t.Fatal(err)
	}
	if c.FailedAttempts != 0 || c.Uses != 20 || c.State != "live" {
		t.Fatalf("after the full disk: %d failed attempts, %d uses, %s; want 0, 20, live", c.FailedAttempts, c.Uses, c.State)
	}
}
