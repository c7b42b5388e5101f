package cluster

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stratumjoin/stratum/internal/store"
	"github.com/stratumjoin/stratum/internal/store/boltstore"
)

func boltCluster(t *testing.T) *Cluster {
	t.Helper()
	s, err := boltstore.Open(filepath.Join(t.TempDir(), "state.db"), boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return New(Config{Store: s})
}

// TestUpdateComparesEveryRead: a key read in a round and changed before the
// commit (here by another writer between the read and the commit) makes
// the round run again, even though the round never writes that key.
func TestUpdateComparesEveryRead(t *testing.T) {
	c := boltCluster(t)
	ctx := context.Background()
	if _, err := c.store.Txn(ctx, nil, []store.Op{{Key: "a", Value: []byte("1")}}); err != nil {
		t.Fatal(err)
	}
	rounds := 0
	var seen []string
	err := c.update(ctx, func(tx *txn) error {
		rounds++
		v, _, err := tx.getString("a")
		if err != nil {
			return err
		}
		seen = append(seen, v)
		if rounds == 1 { // another writer moves the key we decided on
			if _, err := c.store.Txn(ctx, nil, []store.Op{{Key: "a", Value: []byte("2")}}); err != nil {
				return err
			}
		}
		tx.putString("b", "decided on a="+v)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if rounds != 2 || strings.Join(seen, ",") != "1,2" {
		t.Fatalf("rounds %d, saw %v; want 2 rounds, 1 then 2", rounds, seen)
	}
	kv, err := c.store.Get(ctx, "b")
	if err != nil || string(kv.Value) != "decided on a=2" {
		t.Fatalf("b = %q, %v", kv.Value, err)
	}
}

// TestUpdateReadOnlyCommitsNothing: a round that writes nothing leaves the
// store as it was, and fn's error ends the update unwritten.
func TestUpdateReadOnlyCommitsNothing(t *testing.T) {
	c := boltCluster(t)
	ctx := context.Background()
	boom := errors.New("boom")
	err := c.update(ctx, func(tx *txn) error {
		tx.putString("x", "1")
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("err %v", err)
	}
	if kv, _ := c.store.Get(ctx, "x"); kv.Rev != 0 {
		t.Fatal("a failed round wrote")
	}
}

// TestCountersParseStrictly: a counter that is not a decimal number is an
// error, never 0 (which would hand out an address twice).
func TestCountersParseStrictly(t *testing.T) {
	c := boltCluster(t)
	ctx := context.Background()
	key := addrKey("net-a", "10.0.0.0/24")
	if _, err := c.store.Txn(ctx, nil, []store.Op{{Key: key, Value: []byte("7 junk")}}); err != nil {
		t.Fatal(err)
	}
	err := c.update(ctx, func(tx *txn) error {
		_, err := tx.getCount(key)
		return err
	})
	if err == nil || !strings.Contains(err.Error(), "not a count") {
		t.Fatalf("err %v, want a refusal of the counter", err)
	}
}

// TestSchemaVersion: a new store is stamped with SchemaVersion, a second
// check passes, and a store of a newer version is refused.
func TestSchemaVersion(t *testing.T) {
	c := boltCluster(t)
	ctx := context.Background()
	if err := c.CheckSchema(ctx); err != nil {
		t.Fatal(err)
	}
	kv, err := c.store.Get(ctx, keySchema)
	if err != nil || string(kv.Value) != "1" {
		t.Fatalf("schema key %q, %v", kv.Value, err)
	}
	if err := c.CheckSchema(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.store.Txn(ctx, nil, []store.Op{{Key: keySchema, Value: []byte("2")}}); err != nil {
		t.Fatal(err)
	}
	if err := c.CheckSchema(ctx); !errors.Is(err, ErrSchema) {
		t.Fatalf("newer schema: err %v, want ErrSchema", err)
	}
}
