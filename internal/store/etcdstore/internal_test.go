package etcdstore

import (
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/stratumjoin/stratum/internal/store/etcdtest"
)

func TestClientConfigFromURL(t *testing.T) {
	tests := []struct {
		url        string
		endpoints  []string
		prefix     string
		tls        bool
		wantErr    string
		notInError string
	}{
		{url: "etcd://10.0.0.1:2379,10.0.0.2:2380/stratum", endpoints: []string{"http://10.0.0.1:2379", "http://10.0.0.2:2380"}, prefix: "/stratum/"},
		{url: "etcd://db1,db2:2381", endpoints: []string{"http://db1:2379", "http://db2:2381"}, prefix: DefaultPrefix},
		{url: "etcd://db1/", endpoints: []string{"http://db1:2379"}, prefix: DefaultPrefix},
		{url: "etcd://db1/a/b/", endpoints: []string{"http://db1:2379"}, prefix: "/a/b/"},
		{url: "etcd://[::1]:2379/x", endpoints: []string{"http://[::1]:2379"}, prefix: "/x/"},
		{url: "etcd://[::1]", endpoints: []string{"http://[::1]:2379"}, prefix: DefaultPrefix},
		{url: "etcds://db1:2379/x", endpoints: []string{"https://db1:2379"}, prefix: "/x/", tls: true},
		{url: "etcd://admin:s3cret@db1/", wantErr: "credentials", notInError: "s3cret"},
		{url: "etcd://db1,,db2/", wantErr: "empty endpoint"},
		{url: "etcd:///x", wantErr: "empty endpoint"},
		{url: "etcd://db1/?dial-timeout=1s", wantErr: "unknown option"},
		{url: "etcd://db1/?cacert=/x", wantErr: "use etcds://"},
		{url: "etcds://db1/?user=u", wantErr: "go together"},
		{url: "etcd:db1", wantErr: "want etcd://"},
		{url: "http://db1/", wantErr: "scheme"},
	}
	for _, tc := range tests {
		t.Run(tc.url, func(t *testing.T) {
			u, err := url.Parse(tc.url)
			if err != nil {
				t.Fatal(err)
			}
			cfg, prefix, err := clientConfig(u)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error = %v, want one containing %q", err, tc.wantErr)
				}
				if tc.notInError != "" && strings.Contains(err.Error(), tc.notInError) {
					t.Fatalf("error leaks %q: %v", tc.notInError, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(cfg.Endpoints, tc.endpoints) || prefix != tc.prefix {
				t.Errorf("endpoints %q prefix %q, want %q %q", cfg.Endpoints, prefix, tc.endpoints, tc.prefix)
			}
			if (cfg.TLS != nil) != tc.tls {
				t.Errorf("TLS config set = %v, want %v", cfg.TLS != nil, tc.tls)
			}
			if cfg.TLS != nil && cfg.TLS.RootCAs != nil {
				t.Error("etcds should verify against the system roots")
			}
		})
	}
}

func TestOpenParseErrorDoesNotEchoURL(t *testing.T) {
	_, err := Open(t.Context(), "etcd://admin:s3cret@db1:notaport/")
	if err == nil {
		t.Fatal("Open of a malformed URL succeeded")
	}
	if strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("error leaks the password: %v", err)
	}
}

func TestNewNormalisesPrefix(t *testing.T) {
	for in, want := range map[string]string{"": DefaultPrefix, "/": DefaultPrefix, "a": "/a/", "/a": "/a/", "/a/": "/a/", "a/b": "/a/b/"} {
		if got := New(nil, in).prefix; got != want {
			t.Errorf("New(cli, %q) prefix = %q, want %q", in, got, want)
		}
	}
}

func TestCloseClosesOnlyTheClientOpenMade(t *testing.T) {
	endpoint, cli := etcdtest.Start(t)
	opened, err := Open(t.Context(), "etcd://"+strings.TrimPrefix(endpoint, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	given := New(cli, "")
	for _, s := range []*Store{opened, given} {
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if opened.cli.Ctx().Err() == nil {
		t.Error("Close left open the client Open made")
	}
	if cli.Ctx().Err() != nil {
		t.Error("Close of a New store closed the caller's client")
	}
	if _, err := cli.Get(t.Context(), "k"); err != nil {
		t.Errorf("caller's client after Close: %v", err)
	}
}
