// Package seedclient is a client of the admin API written only from the
// three seed documents (../../shared/seeds: 000 joinTokens, 003 join keys,
// 004 join codes) and the command line of docs/architecture.md#parts. It imports
// nothing of the project: it builds the two commands, runs a listener as a
// subprocess, builds every request by hand, and joins with real agents.
package seedclient_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// repoRoot walks up to the directory holding go.mod.
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test")
		}
		dir = parent
	}
}

// freeUDPPort picks a loopback UDP port for the listener's QUIC socket.
func freeUDPPort(t *testing.T) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	return pc.LocalAddr().String()
}

// lockedBuffer collects a subprocess's output while it runs.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

type cluster struct {
	bin      string
	env      []string
	endpoint string
	base     string
	http     *http.Client
	logs     *lockedBuffer
}

// cli runs a stratum-listener subcommand against the admin socket and
// returns its stdout.
func (c *cluster) cli(t *testing.T, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(c.bin, "stratum-listener"), args...)
	cmd.Env = c.env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("stratum-listener %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return out
}

// call sends one hand-built JSON request over HTTPS with the API key.
func (c *cluster) call(t *testing.T, key, method, path, body string) (int, map[string]any) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, c.base+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("%s %s: %d, not JSON: %s", method, path, resp.StatusCode, raw)
	}
	return resp.StatusCode, out
}

// join runs `stratum-agent join` on a fresh machine (its own state
// directory and SMBIOS product UUID) with secret on stdin, and returns
// the exit status and what it printed.
func (c *cluster) join(t *testing.T, secret, uuid string) (int, map[string]any, string) {
	t.Helper()
	root := t.TempDir()
	dmi := filepath.Join(root, "sys", "class", "dmi", "id")
	if err := os.MkdirAll(dmi, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, v := range map[string]string{"product_uuid": uuid, "sys_vendor": "Seed Client", "product_name": "Test Machine"} {
		if err := os.WriteFile(filepath.Join(dmi, name), []byte(v+"\n"), 0o444); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(c.bin, "stratum-agent"), "join", "--json",
		"--endpoint", c.endpoint, "--code", "-", "--state", filepath.Join(t.TempDir(), "state"), "--root", root)
	cmd.Stdin = strings.NewReader(secret + "\n")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		t.Fatalf("run agent: %v", err)
	}
	var identity map[string]any
	if code == 0 {
		if err := json.Unmarshal(stdout.Bytes(), &identity); err != nil {
			t.Fatalf("agent output is not JSON: %v\n%s", err, stdout.String())
		}
	}
	return code, identity, stderr.String()
}

func start(t *testing.T) *cluster {
	root := repoRoot(t)
	bin := t.TempDir()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatal("the go tool is needed to build the commands")
	}
	build := exec.Command(goTool, "build", "-o", bin+string(os.PathSeparator), "./cmd/stratum-listener", "./cmd/stratum-agent")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}

	endpoint := freeUDPPort(t)
	data := filepath.Join(t.TempDir(), "listener")
	sockDir, err := os.MkdirTemp("/tmp", "seedclient")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	socket := filepath.Join(sockDir, "admin.sock")
	c := &cluster{bin: bin, endpoint: endpoint, env: append(os.Environ(), "STRATUM_ADMIN_SOCKET="+socket), logs: &lockedBuffer{}}

	c.cli(t, "init", "--data", data, "--light-ksf", "--endpoint", endpoint)
	registry := filepath.Join(t.TempDir(), "registry.yaml")
	if err := os.WriteFile(registry, []byte(registryDoc), 0o600); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	serve := exec.CommandContext(ctx, filepath.Join(bin, "stratum-listener"), "serve", "--data", data, "--listen", endpoint,
		"--admin-socket", socket, "--registry", registry, "--https", "127.0.0.1:0", "--log-level", "debug")
	serve.Env = c.env
	serve.Cancel = func() error { return serve.Process.Signal(os.Interrupt) }
	serve.WaitDelay = 10 * time.Second
	stderr, err := serve.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		_ = serve.Wait()
	})
	httpsAddr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			c.logs.Write(append(sc.Bytes(), '\n'))
			var line struct{ Msg, Addr string }
			if json.Unmarshal(sc.Bytes(), &line) == nil && strings.Contains(line.Msg, "https") && line.Addr != "" {
				select {
				case httpsAddr <- line.Addr:
				default:
				}
			}
		}
	}()
	select {
	case addr := <-httpsAddr:
		c.base = "https://" + addr
	case <-time.After(30 * time.Second):
		t.Fatalf("the listener did not say where HTTPS listens:\n%s", c.logs.String())
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := os.Stat(socket); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no admin socket")
		}
	}

	// trust the cluster CA, as `ca show --json` gives it
	var ca struct {
		RootsPem string `json:"rootsPem"`
	}
	if err := json.Unmarshal(c.cli(t, "ca", "show", "--json"), &ca); err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM([]byte(ca.RootsPem)) {
		t.Fatal("ca show gave no roots")
	}
	c.http = &http.Client{Timeout: time.Minute, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13}}}
	return c
}

const registryDoc = `
tenants:
  - id: acme
sites:
  - {id: fra1, owner: platform}
pools:
  - {id: pool-a, tenant: acme, site: fra1, agent: bcd}
networks:
  - {id: network-ACME, tenant: acme, cidr: 100.100.0.0/22, ipv6Prefix: "fdef:c0:c0:1::/80"}
roles:
  - {id: role-CI, tenant: acme}
`

// TestSeedClient creates, lists and revokes (or deletes) a secret through
// each of the three facades, joins a real agent with each, and checks that
// the same secret is refused afterwards.
func TestSeedClient(t *testing.T) {
	c := start(t)
	var key struct {
		ID  string `json:"id"`
		Key string `json:"key"`
	}
	if err := json.Unmarshal(c.cli(t, "apikeys", "create", "--json", "--tenant", "acme", "--name", "seed-client",
		"--grant", "compute:join-tokens:create@compute-pool/pool-a",
		"--grant", "compute:join-tokens:read@compute-pool/pool-a",
		"--grant", "compute:join-tokens:revoke@compute-pool/*",
		"--grant", "ha:DescribeJoinCodes@cluster", "--grant", "ha:CreateJoinCode@cluster", "--grant", "ha:RevokeJoinCode@cluster",
		"--scope", "join-keys:create", "--scope", "join-keys:list", "--scope", "join-keys:read", "--scope", "join-keys:delete"), &key); err != nil || !strings.HasPrefix(key.Key, "sjk_") {
		t.Fatalf("apikeys create: %v %q", err, key.Key)
	}
	if out := string(c.cli(t, "apikeys", "list")); strings.Contains(out, key.Key) || !strings.Contains(out, "seed-client") {
		t.Fatalf("apikeys list:\n%s", out)
	}
	if out := string(c.cli(t, "registry", "show")); !strings.Contains(out, "pool-a") || !strings.Contains(out, "network-ACME") {
		t.Fatalf("registry show:\n%s", out)
	}
	var secrets []string

	t.Run("the joinTokens API joinTokens", func(t *testing.T) {
		status, tok := c.call(t, key.Key, "POST", "/api/compute/joinTokens/create",
			`{"tenantId":"acme","poolId":"pool-a","maxUses":5,"ttlSeconds":600,"idempotencyKey":"seed-client-1"}`)
		bearer, _ := tok["token"].(string)
		id, _ := tok["id"].(string)
		if status != 200 || !strings.HasPrefix(bearer, "bcjt_"+id+".") {
			t.Fatalf("create: %d %v", status, tok)
		}
		secrets = append(secrets, bearer)
		status, again := c.call(t, key.Key, "POST", "/api/compute/joinTokens/create",
			`{"tenantId":"acme","poolId":"pool-a","maxUses":5,"ttlSeconds":600,"idempotencyKey":"seed-client-1"}`)
		if status != 200 || again["id"] != id || again["token"] != nil {
			t.Fatalf("retry: %d %v", status, again)
		}
		status, list := c.call(t, key.Key, "POST", "/api/compute/joinTokens/list", `{"tenantId":"acme","poolId":"pool-a"}`)
		if status != 200 || !listed(list["items"], id) || strings.Contains(fmt.Sprint(list), bearer) {
			t.Fatalf("list: %d %v", status, list)
		}

		code, identity, stderr := c.join(t, bearer, "9f1c2a34-5b6d-4e7f-8a9b-0c1d2e3f4a01")
		if code != 0 || identity["trust"] != "platform" || identity["role"] != "node" {
			t.Fatalf("join: exit %d %v\n%s", code, identity, stderr)
		}

		status, rev := c.call(t, key.Key, "POST", "/api/compute/joinTokens/revoke", fmt.Sprintf(`{"tenantId":"acme","poolId":"pool-a","tokenId":%q}`, id))
		if status != 200 || rev["revokedAt"] == nil {
			t.Fatalf("revoke: %d %v", status, rev)
		}
		if code, _, stderr := c.join(t, bearer, "9f1c2a34-5b6d-4e7f-8a9b-0c1d2e3f4a02"); code != 1 || !strings.Contains(stderr, "revoked") {
			t.Fatalf("join after revoke: exit %d\n%s", code, stderr)
		}
		status, e := c.call(t, key.Key, "POST", "/api/compute/joinTokens/revoke", `{"tenantId":"acme","poolId":"pool-a","tokenId":"jt_00000000000000000000000000"}`)
		if errObj, _ := e["error"].(map[string]any); status != 404 || errObj["code"] != "NOT_FOUND" {
			t.Fatalf("revoke unknown: %d %v", status, e)
		}
	})

	t.Run("the join-keys API join keys", func(t *testing.T) {
		status, created := c.call(t, key.Key, "POST", "/v1/join-keys",
			`{"name":"ci-runner","networkID":"network-ACME","roleID":"role-CI","tags":["env:ci"],"autoAssignCIDRs":["100.100.0.0/22"],"expiresAt":"2099-01-01T00:00:00Z"}`)
		data, _ := created["data"].(map[string]any)
		id, _ := data["id"].(string)
		token, _ := data["token"].(string)
		if status != 200 || !strings.HasPrefix(id, "dnjoin-") || !strings.HasPrefix(token, id+"-") {
			t.Fatalf("create: %d %v", status, created)
		}
		secrets = append(secrets, token)
		if fmt.Sprint(data["autoAssignCIDRs"]) != "[100.100.0.0/22 fdef:c0:c0:1::/80]" || data["organizationID"] != "acme" {
			t.Errorf("created %v", data)
		}
		status, dup := c.call(t, key.Key, "POST", "/v1/join-keys", `{"name":"ci-runner","networkID":"network-ACME"}`)
		if errs, _ := dup["errors"].([]any); status != 400 || len(errs) != 1 || errs[0].(map[string]any)["code"] != "ERR_DUPLICATE_VALUE" || errs[0].(map[string]any)["path"] != "name" {
			t.Fatalf("duplicate: %d %v", status, dup)
		}
		status, list := c.call(t, key.Key, "GET", "/v1/join-keys", "")
		if status != 200 || !listed(list["data"], id) || strings.Contains(fmt.Sprint(list), token) {
			t.Fatalf("list: %d %v", status, list)
		}

		code, identity, stderr := c.join(t, token, "9f1c2a34-5b6d-4e7f-8a9b-0c1d2e3f4a03")
		host, _ := identity["host"].(map[string]any)
		if code != 0 || host["networkID"] != "network-ACME" || host["roleID"] != "role-CI" || fmt.Sprint(host["addresses"]) != "[100.100.0.1/22 fdef:c0:c0:1::1/80]" {
			t.Fatalf("join: exit %d %v\n%s", code, identity, stderr)
		}

		if status, del := c.call(t, key.Key, "DELETE", "/v1/join-keys/"+id, ""); status != 200 {
			t.Fatalf("delete: %d %v", status, del)
		}
		if code, _, stderr := c.join(t, token, "9f1c2a34-5b6d-4e7f-8a9b-0c1d2e3f4a04"); code != 1 {
			t.Fatalf("join after delete: exit %d\n%s", code, stderr)
		}
		if status, _ := c.call(t, key.Key, "GET", "/v1/join-keys/"+id, ""); status != 404 {
			t.Fatalf("get after delete: %d", status)
		}
		status, unauth := c.call(t, "sjk_wrong", "GET", "/v1/join-keys", "")
		if errs, _ := unauth["errors"].([]any); status != 401 || len(errs) != 1 || errs[0].(map[string]any)["code"] != "ERR_UNAUTHORIZED" {
			t.Fatalf("bad key: %d %v", status, unauth)
		}
	})

	t.Run("the join-codes API join codes", func(t *testing.T) {
		status, minted := c.call(t, key.Key, "POST", "/v1/admin/cluster/join-codes", `{"pool":"pool-a","maxUses":5,"ttlSeconds":600,"autoApprove":true}`)
		id, _ := minted["id"].(string)
		joinCode, _ := minted["code"].(string)
		if status != 201 || id == "" || len(joinCode) != 13 {
			t.Fatalf("mint: %d %v", status, minted)
		}
		secrets = append(secrets, joinCode)
		status, list := c.call(t, key.Key, "GET", "/v1/admin/cluster/join-codes", "")
		items, _ := list["items"].([]any)
		if status != 200 || len(items) != 1 || strings.Contains(fmt.Sprint(list), joinCode) {
			t.Fatalf("list: %d %v", status, list)
		}
		item := items[0].(map[string]any)
		for _, f := range []string{"id", "selector", "failedAttempts", "endpoint", "caFingerprint", "state", "createdBy", "createdAt", "expiresAt", "registrations"} {
			if _, ok := item[f]; !ok {
				t.Errorf("listed code lacks %s", f)
			}
		}
		if item["state"] != "live" || item["selector"] != joinCode[:2] || item["endpoint"] != c.endpoint {
			t.Errorf("listed %v", item)
		}

		if code, identity, stderr := c.join(t, joinCode, "9f1c2a34-5b6d-4e7f-8a9b-0c1d2e3f4a05"); code != 0 || identity["nodeId"] == nil {
			t.Fatalf("join: exit %d %v\n%s", code, identity, stderr)
		}
		status, rev := c.call(t, key.Key, "POST", "/v1/admin/cluster/join-codes/"+id+"/revoke", "")
		if status != 200 || rev["state"] != "revoked" || rev["registrations"] != 1.0 {
			t.Fatalf("revoke: %d %v", status, rev)
		}
		if code, _, stderr := c.join(t, joinCode, "9f1c2a34-5b6d-4e7f-8a9b-0c1d2e3f4a06"); code != 1 || !strings.Contains(stderr, "revoked") {
			t.Fatalf("join after revoke: exit %d\n%s", code, stderr)
		}
		status, p := c.call(t, key.Key, "GET", "/v1/admin/cluster/join-codes/jc-nope", "")
		if status != 404 || p["code"] != "NOT_FOUND" || p["requestId"] == nil || p["type"] == nil || p["title"] == nil || p["status"] != 404.0 {
			t.Fatalf("get unknown: %d %v", status, p)
		}
	})

	// events: one created and one revoked for the token, in the store and
	// in the log; no secret anywhere
	events := string(c.cli(t, "events", "--json"))
	if strings.Count(events, `"security.join-token.created"`) != 1 || strings.Count(events, `"security.join-token.revoked"`) != 1 {
		t.Errorf("token events:\n%s", events)
	}
	for _, s := range append(secrets, key.Key) {
		if strings.Contains(events, s) || strings.Contains(c.logs.String(), s) {
			t.Errorf("a secret appears in the events or the listener log")
		}
	}
	if !strings.Contains(c.logs.String(), `"event":"security.join-token.created"`) {
		t.Errorf("events are not logged as JSON lines:\n%s", c.logs.String())
	}

	// a revoked API key is refused at once
	c.cli(t, "apikeys", "revoke", key.ID)
	status, e := c.call(t, key.Key, "POST", "/api/compute/joinTokens/list", `{"tenantId":"acme","poolId":"pool-a"}`)
	if errObj, _ := e["error"].(map[string]any); status != 401 || errObj["code"] != "UNAUTHENTICATED" {
		t.Fatalf("revoked key: %d %v", status, e)
	}
}

// listed reports whether a JSON array of objects has one with this id.
func listed(items any, id string) bool {
	list, _ := items.([]any)
	for _, it := range list {
		if m, ok := it.(map[string]any); ok && m["id"] == id {
			return true
		}
	}
	return false
}
