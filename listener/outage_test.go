package listener_test

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/stratumjoin/stratum/agent"
	"github.com/stratumjoin/stratum/internal/store"
	"github.com/stratumjoin/stratum/internal/store/etcdstore"
	"github.com/stratumjoin/stratum/internal/store/etcdtest"
	"github.com/stratumjoin/stratum/internal/wire"
	"github.com/stratumjoin/stratum/listener"
	"github.com/stratumjoin/stratum/listener/adminapi"
	"github.com/stratumjoin/stratum/listener/adminclient"
	"github.com/stratumjoin/stratum/listener/listenertest"
)

// outageBound bounds how long an answer may take once the store is cut
// off: the store deadline here is 1 s, and before deadlines an agent
// waited 90 s and `codes list` over two minutes. It only bounds a wait
// for an answer that must come.
const outageBound = 20 * time.Second

// TestStoreOutageAnswersUnavailable: with its etcd out of quorum, an agent
// reads a retryable JOIN_UNAVAILABLE that says the listener cannot reach
// its store, with a RetryAfter, and `codes list` answers 503.
func TestStoreOutageAnswersUnavailable(t *testing.T) {
	etcd := etcdtest.StartStoppable(t)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcd.Endpoint}, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	l := listenertest.Start(t, listenertest.Options{Config: listener.Config{Store: etcdstore.New(cli, "/outage/"), StoreTimeout: time.Second}})
	sec, _ := mint(t, l, adminapi.MintCodeRequest{AutoApprove: true})

	etcd.Stop()

	start := time.Now()
	_, _, err = join(t, l, sec, wire.Facts{})
	took := time.Since(start)
	t.Logf("join refused after %v: %v", took, err)
	var refused *agent.RefusedError
	if !errors.As(err, &refused) || refused.Code != wire.CodeUnavailable || !refused.Retryable() {
		t.Fatalf("join with the store cut off: %v, want a retryable %s", err, wire.CodeUnavailable)
	}
	if !strings.Contains(refused.Message, "cannot reach its store") || refused.RetryAfter < time.Second {
		t.Errorf("refusal %q, retry after %v", refused.Message, refused.RetryAfter)
	}
	if took > outageBound {
		t.Errorf("the refusal took %v", took)
	}

	start = time.Now()
	_, err = l.Admin.Codes(context.Background())
	took = time.Since(start)
	t.Logf("codes list answered after %v: %v", took, err)
	var p *adminclient.ProblemError
	if !errors.As(err, &p) || !p.Transient() || p.Code != adminapi.CodeUnavailable {
		t.Fatalf("codes list with the store cut off: %v, want 503 UNAVAILABLE", err)
	}
	if took > outageBound {
		t.Errorf("the answer took %v", took)
	}
}

// corruptLeaves overwrites the element headers of every bbolt leaf page of
// the file with offsets far outside the page, as flipped bits would.
func corruptLeaves(t *testing.T, path string) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for off := 2 * 4096; off+4096 <= len(raw); off += 4096 {
		flags, count := binary.LittleEndian.Uint16(raw[off+8:]), binary.LittleEndian.Uint16(raw[off+10:])
		if flags != 0x02 || count == 0 {
			continue
		}
		bad := make([]byte, 16*int(count))
		for i := range int(count) {
			binary.LittleEndian.PutUint32(bad[16*i+4:], 0x7fff0000)
			binary.LittleEndian.PutUint32(bad[16*i+8:], 0x7fff)
		}
		if _, err := f.WriteAt(bad, int64(off+16)); err != nil {
			t.Fatal(err)
		}
	}
}

// TestDamagedPagesWhileServing: pages damaged under a serving listener
// make admin reads answer 503 and joins JOIN_UNAVAILABLE; the process and
// its handlers live on, and the listener reports itself unhealthy.
func TestDamagedPagesWhileServing(t *testing.T) {
	l := listenertest.Start(t, listenertest.Options{})
	sec, _ := mint(t, l, adminapi.MintCodeRequest{AutoApprove: true})
	for range 30 {
		mint(t, l, adminapi.MintCodeRequest{AutoApprove: true})
	}
	if err := l.Healthy(); err != nil {
		t.Fatal(err)
	}
	corruptLeaves(t, filepath.Join(l.DataDir, "state.db"))
	for range 2 { // the second call shows the process survived the first
		_, err := l.Admin.Codes(context.Background())
		var p *adminclient.ProblemError
		if !errors.As(err, &p) || !p.Transient() || !strings.Contains(p.Detail, "damaged") {
			t.Fatalf("codes list on damaged pages: %v", err)
		}
	}
	_, _, err := join(t, l, sec, wire.Facts{})
	var refused *agent.RefusedError
	if !errors.As(err, &refused) || refused.Code != wire.CodeUnavailable || !strings.Contains(refused.Message, "damaged") {
		t.Fatalf("join on damaged pages: %v", err)
	}
	if err := l.Healthy(); !errors.Is(err, store.ErrCorrupt) {
		t.Fatalf("Healthy after damage: %v", err)
	}
	if err := l.Ready(context.Background()); !errors.Is(err, store.ErrCorrupt) {
		t.Fatalf("Ready after damage: %v, want not ready", err)
	}
}
