package bench

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// floorClientSyncs is how many fsyncs the floor client makes: node.key,
// node.crt and ca.pem, each synced before its rename, and one sync of the
// directory. floorServerSyncs is the floor server's one fdatasync of the
// issued certificate before its Result.
const (
	floorClientSyncs = 4
	floorServerSyncs = 1
)

// floorJoins runs n floor client processes (bench/floorclient) against
// the floor server at addr (or, with addr "start", n that only start and
// exit).
func floorJoins(b *testing.B, addr string, n int) (wall, cpu []time.Duration) {
	b.Helper()
	dir := b.TempDir()
	for i := range n {
		cmd := exec.Command(filepath.Join(binDir, "floorclient"), addr, filepath.Join(dir, fmt.Sprint(i)))
		var stderr strings.Builder
		cmd.Stderr = &stderr
		t0 := time.Now()
		if err := cmd.Run(); err != nil {
			b.Fatalf("floor client %d: %v\n%s", i, err, stderr.String())
		}
		wall = append(wall, time.Since(t0))
		cpu = append(cpu, cmd.ProcessState.UserTime()+cmd.ProcessState.SystemTime())
	}
	return wall, cpu
}

// agentStarts runs n `stratum-agent version` processes: what starting the
// agent binary costs before it does any of a join's work.
func agentStarts(b *testing.B, n int) (wall, cpu []time.Duration) {
	b.Helper()
	for range n {
		cmd := exec.Command(filepath.Join(binDir, "stratum-agent"), "version")
		t0 := time.Now()
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("stratum-agent version: %v\n%s", err, out)
		}
		wall = append(wall, time.Since(t0))
		cpu = append(cpu, cmd.ProcessState.UserTime()+cmd.ProcessState.SystemTime())
	}
	return wall, cpu
}

// mintJoinKey mints a join key in the registry's network net-bench through
// the admin socket (as the bootstrap admin, in the default organization).
func (p *proc) mintJoinKey(b *testing.B) string {
	b.Helper()
	return p.mintJoinKeyAs(b, "bench-oneshot", time.Date(2099, 1, 1, 0, 0, 0, 0, time.UTC))
}

// mintJoinKeyAs mints a join key named name that expires at expires.
func (p *proc) mintJoinKeyAs(b *testing.B, name string, expires time.Time) string {
	b.Helper()
	body := fmt.Sprintf(`{"name":%q,"networkID":"net-bench","expiresAt":%q}`, name, expires.UTC().Format(time.RFC3339))
	resp, err := socketClient(p.sock).Post("http://stratum-admin/v1/join-keys", "application/json", strings.NewReader(body))
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct{ Data struct{ Token string } }
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != 200 || out.Data.Token == "" {
		b.Fatalf("mint join key: %d %v", resp.StatusCode, err)
	}
	return out.Data.Token
}

// benchRegistry is the default registry plus one network, which a join key
// needs; it changes nothing a token or a code join does.
const benchRegistry = `
tenants:
  - id: default
sites:
  - {id: default, owner: platform}
pools:
  - {id: default, tenant: default, site: default, agent: bcd}
networks:
  - {id: net-bench, tenant: default, cidr: 100.64.0.0/16}
`

// oneShotFigures are one round's figures for one kind.
type oneShotFigures struct {
	p50, p90, agentCPU, serverCPU time.Duration
}

// BenchmarkOneShotJoin times real one-shot `stratum-agent join` processes,
// from exec to exit, on loopback against one listener process with its
// default settings, for the default token (identity KSF), the default code
// (Argon2id t=1 8 MiB, minted --auto-approve so no one waits) and a join
// key, next to the floor measured in the same run: a floor client process
// (bench/floorclient) doing only what a token join must, against
// a floor server doing only what the listener must (KE3 check and one
// durable write included), and against a bare one (neither); and, for
// scale, the floor client process that only starts and exits, and
// `stratum-agent version`. Each repetition takes n turns of one process of
// every kind, in an order that rotates. It logs per repetition p50 and p90
// wall, the client's CPU and the server's CPU per join, then min/median/max
// over the repetitions, the ratios token p50 / floor p50 and listener CPU /
// floor server CPU per join, and the durable writes: how many fsyncs each
// side makes and what one costs here.
//
// The listener's per-source budgets (unproven starts, connections) and its
// Retry threshold are lifted: every agent here comes from 127.0.0.1, and a
// fleet's agents have addresses of their own.
func BenchmarkOneShotJoin(b *testing.B) {
	const (
		reps = 5
		n    = 12 // joins per kind per repetition
	)
	registry := filepath.Join(b.TempDir(), "registry.yaml")
	if err := os.WriteFile(registry, []byte(benchRegistry), 0o600); err != nil {
		b.Fatal(err)
	}
	p := startListener(b, false, "--retry-above", "100000", "--registry", registry)
	token := p.mintToken(b, 10000, "bench-oneshot")
	code := strings.Fields(p.mint(b, "--ttl", "1h"))[0]
	joinKey := p.mintJoinKey(b)

	floorDir := b.TempDir()
	floor, addr := startFloor(b, "STRATUM_BENCH_FLOOR=oneshot", "STRATUM_BENCH_FLOOR_DIR="+floorDir)
	// and the bare floor: the same exchange, no KE3 check, no durable write
	bare, bareAddr := startFloor(b, "STRATUM_BENCH_FLOOR=oneshot-bare")

	type kind struct {
		name string
		run  func() (wall, cpu []time.Duration)
		pid  int // the server whose CPU a join costs; 0 for none
	}
	agentKind := func(secret string) func() ([]time.Duration, []time.Duration) {
		return func() ([]time.Duration, []time.Duration) { return agentJoins(b, p, secret, 1) }
	}
	kinds := []kind{
		{"agent, default token", agentKind(token), p.cmd.Process.Pid},
		{"agent, default code", agentKind(code), p.cmd.Process.Pid},
		{"agent, join key", agentKind(joinKey), p.cmd.Process.Pid},
		{"floor (token)", func() ([]time.Duration, []time.Duration) { return floorJoins(b, addr, 1) }, floor.Process.Pid},
		{"bare floor (token)", func() ([]time.Duration, []time.Duration) { return floorJoins(b, bareAddr, 1) }, bare.Process.Pid},
		{"floor process start", func() ([]time.Duration, []time.Duration) { return floorJoins(b, "start", 1) }, 0},
		{"agent version", func() ([]time.Duration, []time.Duration) { return agentStarts(b, 1) }, 0},
	}
	// one warm-up join on each side, so no repetition pays for a cold
	// page cache
	agentJoins(b, p, token, 1)
	floorJoins(b, addr, 1)
	floorJoins(b, bareAddr, 1)

	// Each repetition takes n turns; each turn runs one process of every
	// kind, in an order that rotates from turn to turn, so a burst of load
	// from elsewhere on the machine lands on every kind alike.
	figs := map[string][]oneShotFigures{}
	turn := 0
	for range reps {
		wall := make([][]time.Duration, len(kinds))
		cpus := make([][]time.Duration, len(kinds))
		server := make([]time.Duration, len(kinds))
		for range n {
			for i := range kinds {
				ki := (i + turn) % len(kinds)
				k := kinds[ki]
				var c0 time.Duration
				if k.pid != 0 {
					c0 = cpu(k.pid)
				}
				w, c := k.run()
				if k.pid != 0 {
					server[ki] += cpu(k.pid) - c0
				}
				wall[ki] = append(wall[ki], w...)
				cpus[ki] = append(cpus[ki], c...)
			}
			turn++
		}
		for i, k := range kinds {
			figs[k.name] = append(figs[k.name], oneShotFigures{p50: percentile(wall[i], .5), p90: percentile(wall[i], .9),
				agentCPU: percentile(cpus[i], .5), serverCPU: server[i] / n})
		}
	}

	var t strings.Builder
	fmt.Fprintf(&t, "one-shot joins from exec to exit, %d per kind per repetition, %d repetitions, the kinds interleaved process by process (rotating order):\n", n, reps)
	fmt.Fprintf(&t, "%-22s %4s %10s %10s %12s %14s\n", "kind", "rep", "p50", "p90", "client CPU", "server CPU/join")
	for _, k := range kinds {
		for r, f := range figs[k.name] {
			fmt.Fprintf(&t, "%-22s %4d %10s %10s %12s %14s\n", k.name, r+1, ms(f.p50), ms(f.p90), ms(f.agentCPU), ms(f.serverCPU))
		}
	}
	fmt.Fprintf(&t, "over the repetitions, min / median / max:\n")
	for _, k := range kinds {
		fs := figs[k.name]
		fmt.Fprintf(&t, "%-22s p50 %s; p90 %s; client CPU %s; server CPU/join %s\n", k.name,
			spread(fs, func(f oneShotFigures) time.Duration { return f.p50 }),
			spread(fs, func(f oneShotFigures) time.Duration { return f.p90 }),
			spread(fs, func(f oneShotFigures) time.Duration { return f.agentCPU }),
			spread(fs, func(f oneShotFigures) time.Duration { return f.serverCPU }))
	}
	for _, name := range []string{"agent, default token", "agent, default code", "agent, join key"} {
		var ratio []float64
		for r := range reps {
			ratio = append(ratio, float64(figs[name][r].p50)/float64(figs["floor (token)"][r].p50))
		}
		slices.Sort(ratio)
		fmt.Fprintf(&t, "%s p50 / floor p50 of the same repetition: %.2fx / %.2fx / %.2fx\n", name, ratio[0], ratio[len(ratio)/2], ratio[len(ratio)-1])
	}
	// what the listener spends on a real one-shot token join against what
	// a bare server spends on its floor, each repetition's own
	for _, f := range []string{"floor (token)", "bare floor (token)"} {
		var ratio []float64
		for r := range reps {
			ratio = append(ratio, float64(figs["agent, default token"][r].serverCPU)/float64(figs[f][r].serverCPU))
		}
		slices.Sort(ratio)
		fmt.Fprintf(&t, "listener CPU per default token join / %s server CPU per join of the same repetition: %.2fx / %.2fx / %.2fx\n", f, ratio[0], ratio[len(ratio)/2], ratio[len(ratio)-1])
	}
	cost := syncCost(b, floorDir, 100)
	fmt.Fprintf(&t, "durable writes: the floor makes %d fsyncs on the client and %d on the server per join; one 4 KiB write + fdatasync here costs p10 %s p50 %s p90 %s (n=100), so about %s of the floor's p50\n",
		floorClientSyncs, floorServerSyncs, ms(percentile(cost, .1)), ms(percentile(cost, .5)), ms(percentile(cost, .9)),
		ms(time.Duration(floorClientSyncs+floorServerSyncs)*percentile(cost, .5)))
	// counted, outside the timed rounds: one token join and one floor join
	// under strace -c (the listener's count is BenchmarkJoinDurableWrites')
	if _, err := exec.LookPath("strace"); err != nil {
		fmt.Fprintf(&t, "the agent's fsyncs per token join: not counted (no strace)\n")
	} else {
		dir := b.TempDir()
		secret := filepath.Join(dir, "secret")
		if err := os.WriteFile(secret, []byte(token+"\n"), 0o600); err != nil {
			b.Fatal(err)
		}
		agentOut, floorOut := filepath.Join(dir, "agent.strace"), filepath.Join(dir, "floor.strace")
		trace := func(out string, args ...string) {
			cmd := exec.Command("strace", append([]string{"-f", "-c", "-o", out, "-e", "trace=" + syncCalls}, args...)...)
			if msg, err := cmd.CombinedOutput(); err != nil {
				b.Fatalf("%v: %v\n%s", args, err, msg)
			}
		}
		trace(agentOut, filepath.Join(binDir, "stratum-agent"), "join", "--endpoint", p.endpoint, "--code-file", secret,
			"--state", filepath.Join(dir, "state"), "--root", machineRoot(b, 1<<30))
		trace(floorOut, filepath.Join(binDir, "floorclient"), addr, filepath.Join(dir, "floor"))
		fmt.Fprintf(&t, "counted with strace -c: %d fsyncs in one token `stratum-agent join`, %d in one floor client\n",
			straceCalls(b, agentOut), straceCalls(b, floorOut))
	}
	b.Log("\n" + t.String())
}

// spread is "min / median / max" of one figure over the repetitions.
func spread(fs []oneShotFigures, get func(oneShotFigures) time.Duration) string {
	var d []time.Duration
	for _, f := range fs {
		d = append(d, get(f))
	}
	slices.Sort(d)
	return fmt.Sprintf("%s / %s / %s", ms(d[0]), ms(d[len(d)/2]), ms(d[len(d)-1]))
}
