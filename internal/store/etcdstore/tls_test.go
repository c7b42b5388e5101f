package etcdstore_test

import (
	"context"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"

	"github.com/stratumjoin/stratum/internal/store"
	"github.com/stratumjoin/stratum/internal/store/etcdtest"
)

// startTLSEtcd runs an embedded etcd that serves clients over TLS with a
// certificate from the test's CA and demands a client certificate.
func startTLSEtcd(t *testing.T, files etcdtest.TLSFiles) string {
	t.Helper()
	local := url.URL{Scheme: "https", Host: "127.0.0.1:0"}
	ep, _ := etcdtest.Start(t, func(c *embed.Config) {
		c.ListenClientUrls, c.AdvertiseClientUrls = []url.URL{local}, []url.URL{local}
		c.ClientTLSInfo = transport.TLSInfo{CertFile: files.ServerCert, KeyFile: files.ServerKey, TrustedCAFile: files.CA, ClientCertAuth: true}
	})
	return strings.TrimPrefix(ep, "http://")
}

func openErr(t *testing.T, rawURL string) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	s, err := store.Open(ctx, rawURL)
	if err == nil {
		s.Close()
	}
	return err
}

// TestTLSClientCertificates: etcd with TLS from a custom CA and client
// certificate authentication serves a client configured for it, and each
// misconfiguration is refused permanently with its reason.
func TestTLSClientCertificates(t *testing.T) {
	files := etcdtest.WriteTLSFiles(t, t.TempDir())
	host := startTLSEtcd(t, files)
	good := "etcds://" + host + "/tls?" + url.Values{"cacert": {files.CA}, "cert": {files.ClientCert}, "key": {files.ClientKey}}.Encode()
	if err := openErr(t, good); err != nil {
		t.Fatalf("the right client certificate: %v", err)
	}
	for _, tc := range []struct {
		name, url, want string
	}{
		{"client certificate of another CA", "etcds://" + host + "/tls?" + url.Values{"cacert": {files.CA}, "cert": {files.RogueCert}, "key": {files.RogueKey}}.Encode(), "refused our client certificate"},
		{"no client certificate", "etcds://" + host + "/tls?" + url.Values{"cacert": {files.CA}}.Encode(), "requires a client certificate"},
		{"system roots only", "etcds://" + host + "/tls?" + url.Values{"cert": {files.ClientCert}, "key": {files.ClientKey}}.Encode(), "CA we do not trust"},
	} {
		err := openErr(t, tc.url)
		if !errors.Is(err, store.ErrRefused) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want store.ErrRefused saying %q", tc.name, err, tc.want)
		}
	}
}

// TestUserPassword: with etcd's authentication on, the right user and
// password file serve, a wrong password and a missing user are refused.
func TestUserPassword(t *testing.T) {
	ep, cli := etcdtest.Start(t)
	ctx := t.Context()
	for _, step := range []func() error{
		func() error { _, err := cli.UserAdd(ctx, "root", "rootpw"); return err },
		func() error { _, err := cli.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := cli.UserAdd(ctx, "stratum", "s3cret-pw"); return err },
		func() error { _, err := cli.RoleAdd(ctx, "stratum"); return err },
		func() error {
			_, err := cli.RoleGrantPermission(ctx, "stratum", "/auth/", clientv3.GetPrefixRangeEnd("/auth/"), clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
		func() error { _, err := cli.UserGrantRole(ctx, "stratum", "stratum"); return err },
		func() error { _, err := cli.AuthEnable(ctx); return err },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	dir := t.TempDir()
	pw := filepath.Join(dir, "pw")
	bad := filepath.Join(dir, "bad")
	for p, v := range map[string]string{pw: "s3cret-pw\n", bad: "wrong\n"} {
		if err := os.WriteFile(p, []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	host := strings.TrimPrefix(ep, "http://")
	if err := openErr(t, "etcd://"+host+"/auth?user=stratum&password-file="+pw); err != nil {
		t.Fatalf("the right password: %v", err)
	}
	err := openErr(t, "etcd://"+host+"/auth?user=stratum&password-file="+bad)
	if !errors.Is(err, store.ErrRefused) || !strings.Contains(err.Error(), "rejected user") || strings.Contains(err.Error(), "wrong") {
		t.Errorf("a wrong password: %v", err)
	}
	err = openErr(t, "etcd://"+host+"/auth")
	if !errors.Is(err, store.ErrRefused) || !strings.Contains(err.Error(), "wants a user") {
		t.Errorf("no user: %v", err)
	}
	if err := os.Chmod(pw, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := openErr(t, "etcd://"+host+"/auth?user=stratum&password-file="+pw); err == nil || !strings.Contains(err.Error(), "0600") {
		t.Errorf("a world-readable password file: %v", err)
	}
}
