package etcdtest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stratumjoin/stratum/internal/store/etcdtest"
)

// TestProcsQuorumAndPartition shows what the fault tests rely on: a write
// through a partitioned member or a cluster without quorum does not
// succeed, and one through a healed cluster does.
func TestProcsQuorumAndPartition(t *testing.T) {
	p := etcdtest.StartProcs(t, 3)
	m1 := p.Members[0]
	c1 := p.Client(t, m1)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c1.Put(ctx, "k", "1"); err != nil {
		t.Fatalf("put on a healthy cluster: %v", err)
	}

	// cut off the leader, the harder case: it must lose its peers in both
	// directions, so the two others elect a leader and serve writes
	st, err := c1.Status(ctx, m1.ClientURL)
	if err != nil {
		t.Fatal(err)
	}
	var leader *etcdtest.Member
	others := p.Client(t, p.Members...)
	for _, m := range p.Members {
		ms, err := others.Status(ctx, m.ClientURL)
		if err == nil && ms.Header.MemberId == st.Leader {
			leader = m
		}
	}
	if leader == nil {
		t.Fatal("no member is the leader")
	}
	var rest []*etcdtest.Member
	for _, m := range p.Members {
		if m != leader {
			rest = append(rest, m)
		}
	}
	leader.Partition()
	cl := p.Client(t, leader)
	ctx2, cancel2 := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel2()
	if _, err := cl.Put(ctx2, "cut", "x"); err == nil {
		t.Fatal("a write through a partitioned member succeeded")
	}
	majority := p.Client(t, rest...)
	ctx4, cancel4 := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel4()
	if _, err := majority.Put(ctx4, "k", "1"); err != nil {
		t.Fatalf("the two members left could not elect a leader and write: %v", err)
	}
	leader.Heal()
	p.WaitHealthy(t, leader, 30*time.Second)

	p.Members[1].Kill()
	p.Members[2].Kill()
	ctx3, cancel3 := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel3()
	if _, err := c1.Put(ctx3, "k", "3"); err == nil {
		t.Fatal("a write without quorum succeeded")
	}
	for _, m := range p.Members[1:] {
		if err := m.Start(); err != nil {
			t.Fatal(err)
		}
	}
	p.WaitHealthy(t, m1, 30*time.Second)
	resp, err := c1.Get(context.Background(), "k")
	// a write that timed out has an unknown outcome: etcd may commit it
	// once quorum returns, so k is the last acknowledged value or that one
	if err != nil || len(resp.Kvs) != 1 || (string(resp.Kvs[0].Value) != "1" && string(resp.Kvs[0].Value) != "3") {
		t.Fatalf("after the faults k = %v, %v; want 1 (last acknowledged) or 3 (the timed-out write)", resp, err)
	}
}

// TestProcsTLSAndAuth shows the secured cluster refuses a client without
// the client certificate or the password, and serves one with both.
func TestProcsTLSAndAuth(t *testing.T) {
	p := etcdtest.StartProcs(t, 1, etcdtest.WithClientCertAuth(), etcdtest.WithAuth("s3cret"))
	cli := p.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "k", "v"); err != nil {
		t.Fatalf("put with certificate and password: %v", err)
	}

	cfg := p.ClientConfig(t)
	cfg.Password = "wrong"
	if _, err := clientv3.New(cfg); !errors.Is(err, rpctypes.ErrAuthFailed) {
		t.Fatalf("wrong password: %v, want %v", err, rpctypes.ErrAuthFailed)
	}

	cfg = p.ClientConfig(t)
	cfg.TLS.Certificates = nil
	cfg.DialTimeout = 2 * time.Second
	c, err := clientv3.New(cfg)
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err = c.Get(ctx, "k")
		c.Close()
	}
	if err == nil {
		t.Fatal("a client without a certificate was served")
	}
}
