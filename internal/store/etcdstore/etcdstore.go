// Package etcdstore is the shared store backend: several listeners keep their
// codes, counters, nodes and events in one etcd v3 cluster.
//
// Every write is one etcd Txn whose guard compares each key's ModRevision
// with the revision the caller read (0 for a key that must not exist; etcd
// treats a missing key's ModRevision as 0). There is no lock and no lease, so
// a listener that dies mid-join leaves nothing held.
//
// It registers the URL schemes "etcd" and "etcds" with package store:
//
//	etcd://10.0.0.1:2379,10.0.0.2:2379/stratum
//
// names the endpoints (comma-separated, each with its port, default 2379)
// and the key prefix (the path; "/stratum/" when empty). "etcds" uses TLS,
// verified against the system roots unless the query names a CA. The query
// takes files, never a secret itself, so the URL can be logged:
//
//	etcds://10.0.0.1:2379/stratum?cacert=/etc/stratum/etcd-ca.pem&cert=/etc/stratum/etcd.crt&key=/etc/stratum/etcd.key
//	etcds://10.0.0.1:2379/stratum?user=stratum&password-file=/run/credentials/stratum-listener.service/etcd-password
//
// cacert is the CA that signs the etcd servers' certificates, cert and key
// a client certificate (etcd --client-cert-auth), user and password-file
// etcd's own authentication (the file 0600, its one line the password).
// When etcd answers but refuses the client, Open's error names why and
// wraps store.ErrRefused.
//
// Operations wait for the cluster while their context allows (the etcd
// client waits for a connection rather than failing fast), so callers give
// every call a deadline. A deadline or a lost connection during Txn is an
// error whose outcome is unknown: the write may have been applied.
package etcdstore

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/stratumjoin/stratum/internal/store"
)

const (
	// DefaultPrefix is the key prefix when the URL has no path or New is
	// given "".
	DefaultPrefix = "/stratum/"
	// DefaultDialTimeout bounds Open's first round trip when its context has
	// no earlier deadline.
	DefaultDialTimeout = 5 * time.Second

	defaultPort = "2379"
)

func init() {
	open := func(ctx context.Context, u *url.URL) (store.Store, error) { return open(ctx, u) }
	store.Register("etcd", open)
	store.Register("etcds", open)
}

// Store is a store.Store on an etcd v3 cluster, every key under one prefix.
type Store struct {
	cli       *clientv3.Client
	prefix    string
	ownClient bool
	closed    atomic.Bool
}

var _ store.Store = (*Store)(nil)

// New returns a Store that keeps its keys under prefix (DefaultPrefix when
// empty; a trailing "/" is added when missing, so "/a" and "/ab" never
// overlap). Close leaves cli open: its owner closes it.
func New(cli *clientv3.Client, prefix string) *Store {
	return &Store{cli: cli, prefix: normalisePrefix(prefix)}
}

func normalisePrefix(p string) string {
	p = strings.Trim(p, "/")
	if p == "" {
		return DefaultPrefix
	}
	return "/" + p + "/"
}

// Open connects to the cluster that rawURL names (see the package comment)
// and checks that it answers a linearizable read before ctx ends or
// DefaultDialTimeout passes. Close closes the client Open made.
func Open(ctx context.Context, rawURL string) (*Store, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		// The url package quotes the whole input; keep only the reason.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, fmt.Errorf("parse etcd store url: %w", err)
	}
	return open(ctx, u)
}

func open(ctx context.Context, u *url.URL) (*Store, error) {
	cfg, prefix, err := clientConfig(u)
	if err != nil {
		return nil, err
	}
	if cfg.TLS != nil {
		// A refused certificate is known after one handshake; the etcd
		// client would retry it until its deadline and then say only that.
		if why := probeTLS(ctx, cfg); why != "" {
			return nil, fmt.Errorf("%w: %s", store.ErrRefused, why)
		}
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		return nil, explain(ctx, cfg, err)
	}
	s := &Store{cli: cli, prefix: prefix, ownClient: true}
	probeCtx, cancel := context.WithTimeout(ctx, DefaultDialTimeout)
	defer cancel()
	if _, err := cli.Get(probeCtx, prefix, clientv3.WithCountOnly()); err != nil {
		_ = cli.Close()
		return nil, explain(ctx, cfg, err)
	}
	return s, nil
}

// clientConfig turns an etcd or etcds URL into a client configuration and a
// key prefix.
func clientConfig(u *url.URL) (clientv3.Config, string, error) {
	var cfg clientv3.Config
	httpScheme := "http"
	switch u.Scheme {
	case "etcd":
	case "etcds":
		httpScheme = "https"
		cfg.TLS = &tls.Config{MinVersion: tls.VersionTLS12}
	default:
		return cfg, "", fmt.Errorf("etcd store url: scheme %q, want etcd or etcds", u.Scheme)
	}
	if u.User != nil {
		return cfg, "", errors.New("etcd store url: credentials in the url are not supported; build a client and use etcdstore.New")
	}
	if u.Opaque != "" || u.Fragment != "" {
		return cfg, "", errors.New("etcd store url: want etcd://host:port[,host:port...][/prefix][?options] with no fragment")
	}
	if err := applyQuery(&cfg, u); err != nil {
		return cfg, "", err
	}
	for ep := range strings.SplitSeq(u.Host, ",") {
		host, port, err := net.SplitHostPort(ep)
		if err != nil { // no port
			host, port = strings.TrimSuffix(strings.TrimPrefix(ep, "["), "]"), ""
		}
		if host == "" {
			return cfg, "", fmt.Errorf("etcd store url: empty endpoint in %q", u.Host)
		}
		if port == "" {
			port = defaultPort
		}
		cfg.Endpoints = append(cfg.Endpoints, httpScheme+"://"+net.JoinHostPort(host, port))
	}
	cfg.DialTimeout = DefaultDialTimeout
	// The client's own zap logger would write JSON to stderr next to the
	// listener's slog output; its failures reach us as returned errors.
	cfg.Logger = zap.NewNop()
	return cfg, normalisePrefix(u.Path), nil
}

// errClosed answers calls after Close at once; the etcd client would retry
// reads on its closed connection for seconds before giving up.
var errClosed = errors.New("etcd store is closed")

// Close closes the etcd client when Open created it. Later calls return an
// error; a second Close does nothing.
func (s *Store) Close() error {
	if !s.closed.CompareAndSwap(false, true) || !s.ownClient {
		return nil
	}
	if err := s.cli.Close(); err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("close etcd client: %w", err)
	}
	return nil
}

func (s *Store) kv(raw []byte, modRev int64) store.KV {
	return store.KV{Key: strings.TrimPrefix(string(raw), s.prefix), Rev: modRev}
}

// Get implements store.Store with a linearizable read.
func (s *Store) Get(ctx context.Context, key string) (store.KV, error) {
	if s.closed.Load() {
		return store.KV{}, errClosed
	}
	resp, err := s.cli.Get(ctx, s.prefix+key)
	if err != nil {
		return store.KV{}, fmt.Errorf("etcd get %q: %w", key, err)
	}
	if len(resp.Kvs) == 0 {
		return store.KV{Key: key}, nil
	}
	kv := resp.Kvs[0]
	out := s.kv(kv.Key, kv.ModRevision)
	// The decoded response is ours alone, but an empty value decodes as nil;
	// a key that exists reports a non-nil value, as the bolt backend does.
	out.Value = kv.Value
	if out.Value == nil {
		out.Value = []byte{}
	}
	return out, nil
}

// List implements store.Store with one range read, so the page is a
// consistent snapshot.
func (s *Store) List(ctx context.Context, prefix, after string, limit int) ([]store.KV, error) {
	if s.closed.Load() {
		return nil, errClosed
	}
	start := s.prefix + prefix
	if after >= prefix {
		start = s.prefix + after + "\x00"
	}
	end := clientv3.GetPrefixRangeEnd(s.prefix + prefix)
	if start >= end {
		return nil, nil
	}
	opts := []clientv3.OpOption{clientv3.WithRange(end)}
	if limit > 0 {
		opts = append(opts, clientv3.WithLimit(int64(limit)))
	}
	resp, err := s.cli.Get(ctx, start, opts...)
	if err != nil {
		return nil, fmt.Errorf("etcd list %q: %w", prefix, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, nil
	}
	out := make([]store.KV, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		e := s.kv(kv.Key, kv.ModRevision)
		e.Value = kv.Value
		if e.Value == nil {
			e.Value = []byte{}
		}
		out = append(out, e)
	}
	return out, nil
}

// Txn implements store.Store as one etcd Txn guarded by ModRevision
// comparisons.
func (s *Store) Txn(ctx context.Context, cmps []store.Cmp, ops []store.Op) (bool, error) {
	if s.closed.Load() {
		return false, errClosed
	}
	if err := store.CheckTxn(cmps, ops); err != nil {
		return false, err
	}
	conds := make([]clientv3.Cmp, 0, len(cmps))
	for _, c := range cmps {
		conds = append(conds, clientv3.Compare(clientv3.ModRevision(s.prefix+c.Key), "=", c.Rev))
	}
	then := make([]clientv3.Op, 0, len(ops))
	for _, op := range ops {
		if op.Delete {
			then = append(then, clientv3.OpDelete(s.prefix+op.Key))
		} else {
			// The request is encoded before Commit returns, so op.Value is
			// not retained.
			then = append(then, clientv3.OpPut(s.prefix+op.Key, string(op.Value)))
		}
	}
	resp, err := s.cli.Txn(ctx).If(conds...).Then(then...).Commit()
	if err != nil {
		return false, fmt.Errorf("etcd txn (outcome unknown): %w", err)
	}
	return resp.Succeeded, nil
}

// Dump implements store.Dumper: every key under the prefix as of one
// revision (that of the first page), however long the pages take, so the
// backup is one consistent state while listeners keep writing.
func (s *Store) Dump(ctx context.Context, page func([]store.KV) error) error {
	if s.closed.Load() {
		return errClosed
	}
	end := clientv3.GetPrefixRangeEnd(s.prefix)
	start, rev := s.prefix, int64(0)
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(500)}
		if rev != 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		resp, err := s.cli.Get(ctx, start, opts...)
		if err != nil {
			return store.NameSpace(fmt.Errorf("etcd dump at revision %d: %w", rev, err))
		}
		if rev == 0 {
			rev = resp.Header.Revision
		}
		if len(resp.Kvs) == 0 {
			return nil
		}
		kvs := make([]store.KV, 0, len(resp.Kvs))
		for _, kv := range resp.Kvs {
			e := s.kv(kv.Key, kv.ModRevision)
			e.Value = kv.Value
			if e.Value == nil {
				e.Value = []byte{}
			}
			kvs = append(kvs, e)
		}
		if err := page(kvs); err != nil {
			return err
		}
		if !resp.More {
			return nil
		}
		start = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

var _ store.Watcher = (*Store)(nil)

// Watch implements store.Watcher with an etcd watch on the key. The watch
// requires a leader, so a member cut off from its cluster ends it (the
// caller reads again and watches anew) instead of staying silent.
func (s *Store) Watch(ctx context.Context, key string) (<-chan struct{}, error) {
	if s.closed.Load() {
		return nil, errClosed
	}
	// Watch from the revision now: the caller reads the key after Watch
	// returns, and no change after that read can then be missed, even if
	// the watch reaches the server later.
	cur, err := s.cli.Get(ctx, s.prefix+key, clientv3.WithCountOnly())
	if err != nil {
		return nil, fmt.Errorf("etcd watch %q: %w", key, err)
	}
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	wch := s.cli.Watch(wctx, s.prefix+key, clientv3.WithRev(cur.Header.Revision+1))
	out := make(chan struct{}, 1)
	go func() {
		defer cancel()
		defer close(out)
		for resp := range wch {
			if resp.Err() != nil || resp.Canceled {
				return
			}
			if len(resp.Events) == 0 {
				continue
			}
			select {
			case out <- struct{}{}:
			default:
			}
		}
	}()
	return out, nil
}
