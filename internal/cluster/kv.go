package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/stratumjoin/stratum/internal/store"
)

// Key layout in the store.
const (
	pfxSecret   = "secret/"   // secret/<id> -> Secret
	pfxLocator  = "locator/"  // locator/<locator> -> secret id
	pfxNode     = "node/"     // node/<id> -> Node
	pfxIdentity = "identity/" // identity/<pool>/<identity key> -> node id (active nodes)
	pfxJoin     = "join/"     // join/<id> -> Join
	pfxJoinKey  = "joinkey/"  // joinkey/<secret id>/<key fingerprint> -> join id
	pfxEvent    = "event/"    // event/<seq> -> Event
	pfxSerial   = "serial/"   // serial/<cert serial> -> node id[#generation] (serialOwner)
	pfxAddr     = "addr/"     // addr/<network id>/<cidr> -> last address index handed out
	pfxAPIKey   = "apikey/"   // apikey/<id> -> APIKey
)

// ErrConflict is returned when a compare-and-swap loop gives up.
var ErrConflict = errors.New("too much contention on the store, try again")

// maxCASRounds bounds a compare-and-swap loop; each lost round means some
// other transaction committed, so progress is guaranteed overall.
const maxCASRounds = 1000

// getJSON reads key into v; found is false for a missing key.
func getJSON(ctx context.Context, s store.Store, key string, v any) (rev int64, found bool, err error) {
	kv, err := s.Get(ctx, key)
	if err != nil {
		return 0, false, fmt.Errorf("read %s: %w", key, err)
	}
	if kv.Rev == 0 {
		return 0, false, nil
	}
	if err := json.Unmarshal(kv.Value, v); err != nil {
		return 0, false, fmt.Errorf("decode %s: %w", key, err)
	}
	return kv.Rev, true, nil
}

func putJSON(key string, v any) store.Op {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("cluster: marshal %T: %v", v, err)) // only our own plain structs are marshalled
	}
	return store.Op{Key: key, Value: b}
}

func putString(key, v string) store.Op { return store.Op{Key: key, Value: []byte(v)} }

func getString(ctx context.Context, s store.Store, key string) (string, int64, error) {
	kv, err := s.Get(ctx, key)
	if err != nil {
		return "", 0, fmt.Errorf("read %s: %w", key, err)
	}
	return string(kv.Value), kv.Rev, nil
}

// listJSON decodes every value under prefix, in key order.
func listJSON[T any](ctx context.Context, s store.Store, prefix, after string, limit int) ([]T, error) {
	kvs, err := s.List(ctx, prefix, after, limit)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", prefix, err)
	}
	out := make([]T, 0, len(kvs))
	for _, kv := range kvs {
		var v T
		if err := json.Unmarshal(kv.Value, &v); err != nil {
			return nil, fmt.Errorf("decode %s: %w", kv.Key, err)
		}
		out = append(out, v)
	}
	return out, nil
}

// eventSeq gives events keys that sort in time order, unique across
// listeners sharing a store.
type eventSeq struct {
	mu   sync.Mutex
	last int64
}

func (q *eventSeq) next(now time.Time) string {
	q.mu.Lock()
	n := now.UnixNano()
	if n <= q.last {
		n = q.last + 1
	}
	q.last = n
	q.mu.Unlock()
	var r [4]byte
	_, _ = rand.Read(r[:])
	return fmt.Sprintf("%020d-%s", n, hex.EncodeToString(r[:]))
}

func sortStrings(s []string) { sort.Strings(s) }

func randomID(prefix string, n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}
