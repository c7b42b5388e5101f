package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// socketClient speaks HTTP to the listener's admin socket.
func socketClient(sock string) *http.Client {
	return &http.Client{Timeout: time.Minute, Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
}

// mintToken mints a joinTokens token with the defaults but maxUses
// through the admin socket and returns the bearer form.
func (p *proc) mintToken(b *testing.B, maxUses int, key string) string {
	b.Helper()
	body := fmt.Sprintf(`{"tenantId":"default","poolId":"default","ttlSeconds":3600,"maxUses":%d,"idempotencyKey":%q}`, maxUses, key)
	resp, err := socketClient(p.sock).Post("http://stratum-admin/api/compute/joinTokens/create", "application/json", strings.NewReader(body))
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct{ Token string }
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != 200 {
		b.Fatalf("mint token: %d %v", resp.StatusCode, err)
	}
	return out.Token
}

// revokeToken revokes a joinTokens token through the admin socket.
func (p *proc) revokeToken(b *testing.B, tokenID string) {
	b.Helper()
	body := fmt.Sprintf(`{"tenantId":"default","poolId":"default","tokenId":%q}`, tokenID)
	resp, err := socketClient(p.sock).Post("http://stratum-admin/api/compute/joinTokens/revoke", "application/json", strings.NewReader(body))
	if err != nil {
		b.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		b.Fatalf("revoke token: %d", resp.StatusCode)
	}
}

// agentJoins runs n one-shot `stratum-agent join` processes with secret,
// each on a fresh state directory (the process makes its node key). It
// returns each process's wall time and CPU
// (user + system).
func agentJoins(b *testing.B, p *proc, secret string, n int) (wall, cpu []time.Duration) {
	b.Helper()
	dir := b.TempDir()
	secretFile := filepath.Join(dir, "secret")
	if err := os.WriteFile(secretFile, []byte(secret+"\n"), 0o600); err != nil {
		b.Fatal(err)
	}
	for i := range n {
		state := filepath.Join(dir, fmt.Sprint(i))
		// each run is a machine of its own: its own SMBIOS product UUID
		root := filepath.Join(dir, fmt.Sprint("root-", i))
		dmi := filepath.Join(root, "sys", "class", "dmi", "id")
		if err := os.MkdirAll(dmi, 0o755); err != nil {
			b.Fatal(err)
		}
		uuid := fmt.Sprintf("4c4c4544-0000-0000-0000-%012x", time.Now().UnixNano()&0xffffffffffff)
		if err := os.WriteFile(filepath.Join(dmi, "product_uuid"), []byte(uuid+"\n"), 0o444); err != nil {
			b.Fatal(err)
		}
		cmd := exec.Command(filepath.Join(binDir, "stratum-agent"), "join", "--endpoint", p.endpoint, "--code-file", secretFile, "--state", state, "--root", root)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		t0 := time.Now()
		if err := cmd.Run(); err != nil {
			b.Fatalf("join %d: %v\n%s", i, err, stderr.String())
		}
		wall = append(wall, time.Since(t0))
		cpu = append(cpu, cmd.ProcessState.UserTime()+cmd.ProcessState.SystemTime())
	}
	return wall, cpu
}

// BenchmarkAgentJoinByKind runs real one-shot `stratum-agent join`
// processes against one listener process with its default settings: with
// a default join token (no KSF) and with a default join code (Argon2id
// with the code parameters, minted --auto-approve so no one waits for an
// approver), interleaved in one run. It logs p50, p90 and the agents' CPU.
func BenchmarkAgentJoinByKind(b *testing.B) {
	const n = 40
	p := startListener(b, false, "--retry-above", "100000")
	token := p.mintToken(b, 10000, "bench-join")
	code := strings.Fields(p.mint(b, "--ttl", "1h"))[0]
	kinds := []struct{ name, secret string }{{"default token", token}, {"default code", code}}
	wall := map[string][]time.Duration{}
	agentCPU := map[string][]time.Duration{}
	// interleave in rounds of 5, so load on the machine hits both kinds alike
	for round := 0; round < n/5; round++ {
		for _, k := range kinds {
			w, c := agentJoins(b, p, k.secret, 5)
			wall[k.name] = append(wall[k.name], w...)
			agentCPU[k.name] = append(agentCPU[k.name], c...)
		}
	}
	for _, k := range kinds {
		b.Logf("%s: %d stratum-agent join processes: p50 %s, p90 %s; agent CPU p50 %s", k.name, n,
			ms(percentile(wall[k.name], .5)), ms(percentile(wall[k.name], .9)), ms(percentile(agentCPU[k.name], .5)))
	}
}

// BenchmarkMintByKind mints 1,000 default tokens and then 1,000 default
// codes through a listener process's admin socket and logs the listener's
// CPU per mint and its RSS after each thousand, and again once mints have
// paused past the KSF memory's return (2 s).
func BenchmarkMintByKind(b *testing.B) {
	const n = 1000
	p := startListener(b, false)
	pid := p.cmd.Process.Pid
	start, _ := rss(pid)
	client := socketClient(p.sock)
	post := func(path, body string) {
		resp, err := client.Post("http://stratum-admin"+path, "application/json", strings.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			b.Fatalf("%s: %d", path, resp.StatusCode)
		}
	}
	for _, kind := range []string{"token", "code"} {
		cpu0 := cpu(pid)
		for i := range n {
			if kind == "token" {
				post("/api/compute/joinTokens/create", fmt.Sprintf(`{"tenantId":"default","poolId":"default","ttlSeconds":3600,"idempotencyKey":"mint-%d"}`, i))
			} else {
				// 1,000 live codes fit in the 1,024 selectors
				post("/v1/admin/cluster/join-codes", `{"ttlSeconds":600}`)
			}
		}
		used := (cpu(pid) - cpu0) / n
		right, peak := rss(pid)
		time.Sleep(2 * time.Second) // measured: the memory two seconds after the burst
		later, _ := rss(pid)
		b.Logf("%s: %d mints: listener CPU %s per mint; RSS %d KiB at start, %d KiB right after (peak %d KiB), %d KiB 2 s later",
			kind, n, ms(used), start, right, peak, later)
	}
}
