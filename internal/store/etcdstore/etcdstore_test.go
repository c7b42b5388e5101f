package etcdstore_test

import (
	"context"
	"fmt"
	"net"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/stratumjoin/stratum/internal/store"
	"github.com/stratumjoin/stratum/internal/store/etcdstore"
	"github.com/stratumjoin/stratum/internal/store/etcdtest"
	"github.com/stratumjoin/stratum/internal/store/storetest"
)

// TestConformance runs the suite on one etcd, each subtest under its own
// prefix, which also shows that prefixes keep stores apart.
func TestConformance(t *testing.T) {
	_, cli := etcdtest.Start(t)
	var n atomic.Int64
	storetest.Run(t, func(t *testing.T) store.Store {
		return etcdstore.New(cli, fmt.Sprintf("/conformance/%d", n.Add(1)))
	})
}

// TestReopen opens the store by URL, closes the client it made, and opens it
// again with a new client; the test's directory name serves as the prefix.
func TestReopen(t *testing.T) {
	endpoint, _ := etcdtest.Start(t)
	host := endpoint[len("http://"):]
	storetest.RunReopen(t, func(t *testing.T, dir string) store.Store {
		s, err := store.Open(t.Context(), "etcd://"+host+dir)
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

func TestKeysLiveUnderThePrefix(t *testing.T) {
	_, cli := etcdtest.Start(t)
	ctx := t.Context()
	a, ab := etcdstore.New(cli, "/a"), etcdstore.New(cli, "/ab")
	if ok, err := a.Txn(ctx, nil, []store.Op{{Key: "k", Value: []byte("in a")}}); err != nil || !ok {
		t.Fatalf("Txn = %v, %v", ok, err)
	}
	raw, err := cli.Get(ctx, "/a/k")
	if err != nil || len(raw.Kvs) != 1 || string(raw.Kvs[0].Value) != "in a" {
		t.Fatalf("raw etcd /a/k = %v, %v", raw, err)
	}
	kv, err := a.Get(ctx, "k")
	if err != nil || kv.Key != "k" || kv.Rev != raw.Kvs[0].ModRevision {
		t.Fatalf("Get = %+v, %v; want key without the prefix and rev %d", kv, err, raw.Kvs[0].ModRevision)
	}
	if got, err := ab.List(ctx, "", "", 0); err != nil || len(got) != 0 {
		t.Fatalf("store under /ab lists %v, %v; want nothing", got, err)
	}
	if got, err := ab.Get(ctx, "k"); err != nil || got.Rev != 0 {
		t.Fatalf("store under /ab sees k: %+v, %v", got, err)
	}
}

func TestOpenByURL(t *testing.T) {
	endpoint, cli := etcdtest.Start(t)
	host := endpoint[len("http://"):]
	tests := []struct{ url, rawKey string }{
		{"etcd://" + host + "/custom", "/custom/k"},
		{"etcd://" + host, "/stratum/k"},
		{"etcd://" + host + "," + host + "/two", "/two/k"},
	}
	for _, tc := range tests {
		t.Run(tc.url, func(t *testing.T) {
			ctx := t.Context()
			s, err := store.Open(ctx, tc.url)
			if err != nil {
				t.Fatal(err)
			}
			if ok, err := s.Txn(ctx, nil, []store.Op{{Key: "k", Value: []byte(tc.url)}}); err != nil || !ok {
				t.Fatalf("Txn = %v, %v", ok, err)
			}
			raw, err := cli.Get(ctx, tc.rawKey)
			if err != nil || len(raw.Kvs) != 1 || string(raw.Kvs[0].Value) != tc.url {
				t.Fatalf("raw etcd %s = %v, %v", tc.rawKey, raw, err)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
		})
	}
	if !slices.Contains(store.Schemes(), "etcds") {
		t.Errorf("schemes %v lack etcds", store.Schemes())
	}
}

func closedPort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

func TestOpenFailsWhenNoEtcdAnswers(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	s, err := store.Open(ctx, "etcd://"+closedPort(t))
	if err == nil {
		s.Close()
		t.Fatal("Open succeeded with nothing listening")
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("Open took %v to give up; the context allowed 300ms", took)
	}
}

// A Txn that cannot reach etcd ends with an error when its context does,
// instead of waiting for a connection forever.
func TestTxnEndsWithItsContext(t *testing.T) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"http://" + closedPort(t)}, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	s := etcdstore.New(cli, "")
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	ok, err := s.Txn(ctx, []store.Cmp{{Key: "k"}}, []store.Op{{Key: "k", Value: []byte("v")}})
	if err == nil {
		t.Fatalf("Txn without etcd = %v, nil; want an error", ok)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("Txn took %v to give up; the context allowed 300ms", took)
	}
}

// BenchmarkTxnCAS measures one durable compare-and-swap write (etcd's fsync
// on): a create-if-absent Txn on a new key, over loopback gRPC.
func BenchmarkTxnCAS(b *testing.B) {
	_, cli := etcdtest.Start(b, etcdtest.Durable())
	s := etcdstore.New(cli, "/bench")
	ctx := context.Background()
	value := make([]byte, 200)
	for i := 0; b.Loop(); i++ {
		key := fmt.Sprintf("codes/%08d", i)
		ok, err := s.Txn(ctx, []store.Cmp{{Key: key}}, []store.Op{{Key: key, Value: value}})
		if err != nil || !ok {
			b.Fatalf("Txn = %v, %v", ok, err)
		}
	}
}

// BenchmarkIncrement measures what spending one use of a code costs: a
// linearizable read and a compare-and-swap on the same key.
func BenchmarkIncrement(b *testing.B) {
	_, cli := etcdtest.Start(b, etcdtest.Durable())
	s := etcdstore.New(cli, "/bench")
	ctx := context.Background()
	for b.Loop() {
		if _, err := storetest.Increment(ctx, s, "uses"); err != nil {
			b.Fatal(err)
		}
	}
}
