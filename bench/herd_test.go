package bench

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/stratumjoin/stratum/agent"
	"github.com/stratumjoin/stratum/hwid"
	"github.com/stratumjoin/stratum/internal/joincode"
	"github.com/stratumjoin/stratum/internal/procmem"
)

// The service's retry schedule (agent.RunConfig's defaults): a herd's
// agents back off as `stratum-agent run` would.
const (
	herdBackoffBase = time.Second
	herdBackoffMax  = 4 * time.Minute
)

// herdAgent is one machine of the herd.
type herdAgent struct {
	i      int
	secret string // the bearer form, as the machine was given it
	root   string // its own sysfs tree: its own SMBIOS product UUID
	state  string
	// process: a real `stratum-agent join` process, retried on exit 3;
	// otherwise agent.Join in this process from its own 127.x.y.z
	process bool
	counts  *herdCounts // the herd's, set by runHerd
}

// herdCounts is what the machines of one herd count as they join.
type herdCounts struct {
	collections atomic.Int64 // reported by the real processes
	// machines with a join under way (in-process ones once they hold their
	// descriptors), and the most at once
	joining, peakJoining atomic.Int64
}

// begin counts a machine starting a join attempt; the returned func
// counts it done.
func (c *herdCounts) begin() func() {
	n := c.joining.Add(1)
	for {
		peak := c.peakJoining.Load()
		if n <= peak || c.peakJoining.CompareAndSwap(peak, n) {
			break
		}
	}
	return func() { c.joining.Add(-1) }
}

// herdResult is what one herd measured.
type herdResult struct {
	n, procs                 int
	failed, retries          int64
	elapsed                  time.Duration
	lat                      []time.Duration
	listenerCPU              time.Duration
	inProcCPU, procCPU       time.Duration // the agents' CPU, by kind
	inProcGC                 time.Duration // of inProcCPU, this process's garbage collector
	gogc                     int           // this process's GOGC during the herd, 0 if left as it was
	inProcAlloc              uint64        // bytes this process allocated during the herd
	procGCs                  int64         // collections the real agent processes made, all together
	peakJoining              int64         // the most machines with a join under way at once
	peakRSS, endRSS, settled int           // KiB
	after5s                  int           // KiB, 5 s after the herd
	settledAfter             time.Duration
	anon, file               int           // KiB of the settled RSS: heap and such, and mapped files (the store, the binary)
	storePages               int           // KiB of file the settled RSS holds of the store's mapping
	peakAnon, peakFile       int           // KiB: the largest RssAnon and RssFile sampled during the herd
	peakStorePages           int           // KiB: the most of the store's mapping sampled resident
	floorCPU                 time.Duration // the floor server's CPU per join of the real agent in a wave: the mean of floorBefore and floorAfter
	floorBefore, floorAfter  time.Duration // the floor measured just before the herd and just after it
	// floorDuring is the floor measured while the herd runs, on a machine
	// as loaded as the listener's (0 if not measured); floorDuringAt is
	// when that began and ended, from the herd's start, and
	// floorDuringWhole whether it ended before the herd did
	floorDuring      time.Duration
	floorDuringAt    [2]time.Duration
	floorDuringWhole bool
	storeBytes       int64
	firstFailures    []string
	causes           map[string]int // transient failures by kind
}

// perFloor is the listener's CPU a join over floor, the floor's CPU a join.
func (r herdResult) perFloor(floor time.Duration) float64 {
	return float64(r.listenerCPU) / float64(r.n) / float64(floor)
}

func (r herdResult) floorNote() string {
	if r.floorCPU == 0 {
		return ""
	}
	note := fmt.Sprintf(" (floor %s per agent join in a wave of %d: %s just before the herd, %s just after", ms(r.floorCPU), herdFloorWidth, ms(r.floorBefore), ms(r.floorAfter))
	if r.floorDuring > 0 {
		whole := "all of it during the herd"
		if !r.floorDuringWhole {
			whole = "ending after the herd did"
		}
		note += fmt.Sprintf("; %s during it, %d joins from %s to %s, %s", ms(r.floorDuring), herdProbeJoins, secs(r.floorDuringAt[0]), secs(r.floorDuringAt[1]), whole)
	}
	return note + ")"
}

func (r herdResult) String() string {
	return fmt.Sprintf("%d agents (%d real processes, %d in-process): %d failed, %d transient retries; all done in %s (%.0f joins/s); latency p50 %s p90 %s p99 %s max %s; listener CPU %s per join%s; at most %d machines joining at once; agent CPU per join %s, %s; listener RSS peak %d KiB, %d KiB right after, %d KiB 5s after, %d KiB %s later",
		r.n, r.procs, r.n-r.procs, r.failed, r.retries, r.elapsed.Round(time.Millisecond), float64(r.n)/r.elapsed.Seconds(),
		secs(percentile(r.lat, .5)), secs(percentile(r.lat, .9)), secs(percentile(r.lat, .99)), secs(percentile(r.lat, 1)),
		ms(r.listenerCPU/time.Duration(max(1, r.n))), r.floorNote(), r.peakJoining, r.inProcNote(),
		r.procNote(),
		r.peakRSS, r.endRSS, r.after5s, r.settled, r.settledAfter.Round(time.Second)) + fmt.Sprintf(" (%d KiB anonymous, %d KiB of mapped files: %d KiB the store's pages, the rest the binary's); at the peak at most %d KiB anonymous and %d KiB mapped (%d KiB the store's); store file %d KiB; retried on %v", r.anon, r.file, r.storePages, r.peakAnon, r.peakFile, r.peakStorePages, r.storeBytes/1024, r.causes)
}

// inProcNote gives what the in-process machines cost a join, if there
// were any.
func (r herdResult) inProcNote() string {
	m := r.n - r.procs
	if m <= 0 {
		return "none in-process"
	}
	gogc := "as it was"
	if r.gogc != 0 {
		gogc = strconv.Itoa(r.gogc)
	}
	return fmt.Sprintf("%s in-process (%s of it collecting this process's garbage at GOGC %s, %d KiB allocated a join)",
		ms(r.inProcCPU/time.Duration(m)), ms(r.inProcGC/time.Duration(m)), gogc, r.inProcAlloc/1024/uint64(m))
}

// procNote gives what the real agent processes cost a join, if there
// were any.
func (r herdResult) procNote() string {
	if r.procs <= 0 {
		return "none as processes"
	}
	return fmt.Sprintf("%s per process (%d collections in all %d processes)", ms(r.procCPU/time.Duration(r.procs)), r.procGCs, r.procs)
}

// rusage returns the user+system CPU of who (RUSAGE_SELF, RUSAGE_CHILDREN).
func rusage(who int) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(who, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func secs(d time.Duration) string { return fmt.Sprintf("%.2f s", d.Seconds()) }

// herdSize reads STRATUM_HERD (default 300) and how many of them run as
// real processes: STRATUM_HERD_PROCS, by default as many as this machine
// holds at once (each `stratum-agent join` peaks near 19 MiB; a quarter
// of the memory available goes to them), at most 1,000.
func herdSize(b *testing.B) (n, procs int) {
	n = 300
	if v := os.Getenv("STRATUM_HERD"); v != "" {
		n, _ = strconv.Atoi(v)
	}
	procs = min(n, 1000, memAvailableKiB()/4/(19*1024))
	if v := os.Getenv("STRATUM_HERD_PROCS"); v != "" {
		procs, _ = strconv.Atoi(v)
		procs = min(procs, n)
	}
	// each machine at work holds a few descriptors at once (its UDP
	// socket, netlink sockets while it probes, its state files); a herd
	// of 10,000 ran out at six each, so twelve are reserved. Root may
	// raise the hard limit too
	need := uint64(n)*12 + 4096
	var lim syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim) == nil && lim.Cur < need {
		if lim.Max < need {
			if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: need, Max: need}); err == nil {
				return n, procs
			}
		}
		lim.Cur = min(lim.Max, need)
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil || lim.Cur < need {
			// a machine holds its descriptors only while it joins: at most
			// so many join at once here, the others wait their turn as if
			// they booted later
			joiningAtOnce = make(chan struct{}, max(64, int(lim.Cur-4096)/12))
			b.Logf("open files limited to %d: at most %d in-process machines join at once", lim.Cur, cap(joiningAtOnce))
		}
	}
	return n, procs
}

// joiningAtOnce, when the open-file limit is below what the herd needs,
// bounds the in-process machines joining at once.
var joiningAtOnce chan struct{}

func memAvailableKiB() int {
	b, _ := os.ReadFile("/proc/meminfo")
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemAvailable:" {
			kib, _ := strconv.Atoi(f[1])
			return kib
		}
	}
	return 0
}

// BenchmarkHerd is a fleet booting at once: STRATUM_HERD machines (`make
// herd` sets 10,000) start at the same instant against one listener
// process with its default settings, and each retries transient failures
// on the service's schedule. Up to STRATUM_HERD_PROCS of them are real
// `stratum-agent join` processes; the rest run the same join (hardware
// probe, key, QUIC, OPAQUE, durable state) as goroutines in this process,
// each from an address of its own on 127.0.0.0/8 as a fleet's machines
// have. The processes all come from 127.0.0.1, one address to the
// listener, so its per-source budgets are lifted; its Retry threshold is
// left at its default.
//
// "tokens": each machine holds a joinTokens token of its own (maxUses 1),
// as provisioning hands them out: no approval, no per-secret cap.
//
// "batch codes": machines share join codes of 100 uses (a rack each),
// every join held for approval, and a script approves what is pending
// once a second through the admin API, checking each join's product UUID
// against the inventory, as an operator's automation would. A code admits
// at most 10 unproven exchanges at once (the attempt cap that keeps a
// code to 10 online guesses), so each code's rate is 10 over the time
// from Hello to Proof; the sub-benchmark logs it.
func BenchmarkHerd(b *testing.B) {
	n, procs := herdSize(b)
	runs := envInt("STRATUM_HERD_RUNS", 3)
	codesN := envInt("STRATUM_HERD_CODES", max(1, n/5))
	var tokens, codes, oneCode []herdResult
	// one floor server for every run: the bare server's CPU per join of
	// the real agent in a wave of 256 at once (half the listener's bound on
	// handshakes)
	floor, floorAddr := startFloor(b, "STRATUM_BENCH_FLOOR=1")
	for run := 1; run <= runs; run++ {
		r := herdTokens(b, n, procs, floor, floorAddr, false)
		b.Logf("run %d, tokens: %s", run, r)
		tokens = append(tokens, r)
		if codesN > 0 {
			r := herdCodes(b, codesN, procs*codesN/max(n, 1), 100, false)
			b.Logf("run %d, batch codes of 100 uses, approved by a script once a second: %s", run, r)
			codes = append(codes, r)
			// one code's own rate: its attempt cap, not approval, bounds it
			r = herdCodes(b, 200, 0, 200, true)
			b.Logf("run %d, one code, 200 machines at once, auto-approved: %s", run, r)
			oneCode = append(oneCode, r)
		}
	}
	if len(tokens) > 0 {
		b.Logf("tokens over %d runs: %s", runs, herdSpread(tokens))
	}
	// The floor above is measured on a machine the herd has left or not
	// yet reached. The listener's joins run among the agents' processes,
	// which take its cores' caches and cause switches; the floor measured
	// beside them shows what that costs the same bare work. It loads the
	// machine more, so these runs' latencies are not the herd's figures.
	// (by default three runs, for a spread, in herds long enough to
	// measure it in: `make herd`)
	probes := 0
	if n >= 5000 {
		probes = 3
	}
	var probed []herdResult
	for run := 1; run <= envInt("STRATUM_HERD_PROBE_RUNS", probes); run++ {
		r := herdTokens(b, n, procs, floor, floorAddr, true)
		probed = append(probed, r)
		b.Logf("tokens, the floor also measured during the herd, run %d: %s", run, r)
		b.Logf("tokens, run %d: listener CPU %s per join: %.2fx the floor measured during the herd (%s), %.2fx the floor before and after it (%s)",
			run, ms(r.listenerCPU/time.Duration(r.n)), r.perFloor(r.floorDuring), ms(r.floorDuring), r.perFloor(r.floorCPU), ms(r.floorCPU))
	}
	if len(probed) > 0 {
		b.Logf("tokens, the floor also measured during the herd, over %d runs: %s", len(probed), herdSpread(probed))
	}
	if len(codes) > 0 {
		b.Logf("batch codes over %d runs: %s", runs, herdSpread(codes))
		b.Logf("one code over %d runs: %s", runs, herdSpread(oneCode))
	}
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return v
	}
	return def
}

// herdSpread gives each figure's min, median and max over the runs.
func herdSpread(rs []herdResult) string {
	fig := func(name string, f func(herdResult) float64, format string) string {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = f(r)
		}
		sort.Float64s(v)
		return fmt.Sprintf("%s "+format+" / "+format+" / "+format, name, v[0], v[len(v)/2], v[len(v)-1])
	}
	var floor []string
	if rs[0].floorCPU > 0 {
		floor = []string{
			fig("floor CPU ms/join (same run)", func(r herdResult) float64 { return float64(r.floorCPU) / 1e6 }, "%.2f"),
			fig("listener CPU / floor", func(r herdResult) float64 { return r.perFloor(r.floorCPU) }, "%.2fx"),
		}
	}
	if rs[0].floorDuring > 0 {
		floor = append(floor,
			fig("floor CPU ms/join during the herd", func(r herdResult) float64 { return float64(r.floorDuring) / 1e6 }, "%.2f"),
			fig("listener CPU / floor during the herd", func(r herdResult) float64 { return r.perFloor(r.floorDuring) }, "%.2fx"),
		)
	}
	var inProc []string
	if rs[0].n > rs[0].procs {
		inProc = []string{
			fig("agent CPU ms/join in-process", func(r herdResult) float64 {
				return float64(r.inProcCPU) / 1e6 / float64(r.n-r.procs)
			}, "%.2f"),
			fig("of it this process's collector ms/join", func(r herdResult) float64 {
				return float64(r.inProcGC) / 1e6 / float64(r.n-r.procs)
			}, "%.2f"),
		}
	}
	return "min / median / max: " + strings.Join(append(append(floor, inProc...), []string{
		fig("joins/s", func(r herdResult) float64 { return float64(r.n) / r.elapsed.Seconds() }, "%.0f"),
		fig("p50 s", func(r herdResult) float64 { return percentile(r.lat, .5).Seconds() }, "%.2f"),
		fig("p99 s", func(r herdResult) float64 { return percentile(r.lat, .99).Seconds() }, "%.2f"),
		fig("listener CPU ms/join", func(r herdResult) float64 { return float64(r.listenerCPU) / 1e6 / float64(r.n) }, "%.2f"),
		fig("most machines joining at once", func(r herdResult) float64 { return float64(r.peakJoining) }, "%.0f"),
		fig("retries", func(r herdResult) float64 { return float64(r.retries) }, "%.0f"),
		fig("listener peak RSS MiB", func(r herdResult) float64 { return float64(r.peakRSS) / 1024 }, "%.1f"),
		fig("listener RSS 5s after MiB", func(r herdResult) float64 { return float64(r.after5s) / 1024 }, "%.1f"),
		fig("listener RSS after MiB", func(r herdResult) float64 { return float64(r.settled) / 1024 }, "%.1f"),
		fig("of it anonymous MiB", func(r herdResult) float64 { return float64(r.anon) / 1024 }, "%.1f"),
		fig("of it the store's pages MiB", func(r herdResult) float64 { return float64(r.storePages) / 1024 }, "%.1f"),
	}...), "; ")
}

// herdTokens is one herd of n machines, each with a joinTokens token of
// its own (maxUses 1), as provisioning hands them out: no approval, no
// per-secret cap. The first procs are real processes; floor, at
// floorAddr, is the floor server measured beside it; with probe, also
// during the herd (herdProbeJoins from herdProbeAfter on).
func herdTokens(b *testing.B, n, procs int, floor *exec.Cmd, floorAddr string, probe bool) herdResult {
	p := startListener(b, false, herdServeArgs...)
	defer p.stop()
	tokens := p.mintTokens(b, n)
	agents := make([]herdAgent, n)
	dir := machinesDir(b)
	defer os.RemoveAll(dir)
	for i := range agents {
		agents[i] = herdAgent{i: i, secret: tokens[i], root: herdRoot(b, dir, i), state: filepath.Join(dir, "state", strconv.Itoa(i)), process: i < procs}
	}
	// the floor in the same run, just before the herd and just after it,
	// so a machine whose speed drifts moves the floor with the herd
	// between them
	before, err := floorAgentCPU(b.TempDir(), floor, floorAddr, floorToken, herdFloorJoins, herdFloorWidth)
	if err != nil {
		b.Fatalf("floor before the herd: %v", err)
	}
	var side func(context.Context)
	var during time.Duration
	var duringAt [2]time.Duration
	var duringWhole bool
	var duringErr error
	if probe {
		probeDir := b.TempDir()
		side = func(ctx context.Context) {
			start := time.Now()
			select {
			case <-time.After(herdProbeAfter):
			case <-ctx.Done():
				return
			}
			during, duringErr = floorAgentCPU(probeDir, floor, floorAddr, floorToken, herdProbeJoins, herdFloorWidth)
			duringAt = [2]time.Duration{herdProbeAfter, time.Since(start)}
			duringWhole = ctx.Err() == nil
		}
	}
	r := runHerd(b, p, agents, side, tokenHerdGOGC)
	if r.failed != 0 {
		b.Fatalf("herd: %d failures: %s", r.failed, strings.Join(r.firstFailures, "; "))
	}
	if duringErr != nil {
		b.Fatalf("floor during the herd: %v", duringErr)
	}
	if probe && during == 0 {
		b.Fatalf("the herd ended within %s, before the floor was measured during it", herdProbeAfter)
	}
	r.floorDuring, r.floorDuringAt, r.floorDuringWhole = during, duringAt, duringWhole
	after, err := floorAgentCPU(b.TempDir(), floor, floorAddr, floorToken, herdFloorJoins, herdFloorWidth)
	if err != nil {
		b.Fatalf("floor after the herd: %v", err)
	}
	r.floorBefore, r.floorAfter = before, after
	r.floorCPU = (r.floorBefore + r.floorAfter) / 2
	return r
}

const herdFloorJoins, herdFloorWidth = 3000, 256

// The floor measured during a herd: from 5 s in (every agent has started
// by then), 500 joins of the real agent, which end before a
// 10,000-agent herd does.
const (
	herdProbeAfter = 5 * time.Second
	herdProbeJoins = 500
)

// herdCodes is one herd of m machines sharing join codes of perCode uses
// (a rack each), procs of them real processes. Unless autoApprove, every
// join is held for approval and a script approves what is pending once a
// second through the admin API, checking each join's product UUID against
// the inventory, as an operator's automation would. A code admits at most
// 10 unproven exchanges at once (the attempt cap that keeps a code to 10
// online guesses), so each code's rate is 10 over the time from Hello to
// Proof.
func herdCodes(b *testing.B, m, procs, perCode int, autoApprove bool) herdResult {
	p := startListener(b, false, herdServeArgs...)
	defer p.stop()
	codes := (m + perCode - 1) / perCode
	var secrets, ids []string
	for range codes {
		args := []string{"--max-uses", strconv.Itoa(perCode), "--ttl", "2h"}
		if autoApprove {
			args = append(args, "--auto-approve")
		}
		f := strings.Fields(p.mintHeld(b, args...))
		secrets, ids = append(secrets, f[0]), append(ids, f[1])
	}
	agents := make([]herdAgent, m)
	inventory := map[string]bool{}
	dir := machinesDir(b)
	defer os.RemoveAll(dir)
	perCodeProcs := procs * perCode / max(m, 1)
	for i := range agents {
		// the machines of one code are one rack: consecutive ones
		agents[i] = herdAgent{i: i, secret: secrets[i/perCode], root: herdRoot(b, dir, i), state: filepath.Join(dir, "state", strconv.Itoa(i)), process: i%perCode < perCodeProcs}
		inventory[herdUUID(i)] = true
	}
	var approved atomic.Int64
	var approver func(context.Context)
	if !autoApprove {
		approver = func(ctx context.Context) { approveLoop(ctx, b, p, inventory, &approved) }
	}
	r := runHerd(b, p, agents, approver, 0) // GOGC as it is (see tokenHerdGOGC)
	over := 0
	for _, id := range ids {
		var c struct{ Uses, MaxUses, Registrations int }
		p.adminJSON(b, &c, "codes", "show", id, "--json")
		if c.Uses > c.MaxUses || c.Registrations > c.MaxUses {
			over++
		}
	}
	if r.failed != 0 || over != 0 {
		b.Fatalf("herd: %d failures, %d codes over their uses: %s", r.failed, over, strings.Join(r.firstFailures, "; "))
	}
	if !autoApprove && approved.Load() != int64(m) {
		b.Fatalf("herd: %d joins approved by the script, want %d", approved.Load(), m)
	}
	return r
}

// herdServeArgs lift the listener's per-prefix budget besides the
// per-source ones startListener lifts: the real processes all come from
// 127.0.0.1, as agents behind one NAT would, and such a site must lift them.
// STRATUM_HERD_SERVE_ARGS adds serve flags, to compare settings.
var herdServeArgs = append([]string{"--unproven-per-prefix=-1"}, strings.Fields(os.Getenv("STRATUM_HERD_SERVE_ARGS"))...)

// tokenHerdGOGC is this process's GOGC while a herd of tokens runs. The
// in-process machines share one heap, and its collector is work no machine
// of a fleet does: a real `stratum-agent join` process ends before its heap
// reaches the collector's first goal (the herd reports the collections the
// processes make). At the default of 100 the collector took 0.64-0.83 ms of
// an in-process token join's 3.0-3.8 ms, on the listener's cores; at 400 it
// runs a quarter as often and the heap is still reused (its peak rose from
// 431 to 918 MiB). Held off entirely, faults on fresh memory cost as much
// as it saved. The code herds keep the default: each code join's KSF
// allocates 8 MiB, and at 400 the heap grew to 4.9 GiB (1.4 GiB at 100)
// of fresh memory, and a herd of 2,000 codes took 38 s instead of 29.
const tokenHerdGOGC = 400

// runHerd starts every agent at once and waits for all of them; side, if
// set, runs beside them (the approval script) until they are done. gogc,
// if not 0, is this process's GOGC meanwhile.
func runHerd(b *testing.B, p *proc, agents []herdAgent, side func(context.Context), gogc int) herdResult {
	if gogc != 0 {
		defer debug.SetGCPercent(debug.SetGCPercent(gogc))
	}
	r := herdResult{n: len(agents), gogc: gogc, causes: map[string]int{}}
	for _, a := range agents {
		if a.process {
			r.procs++
		}
	}
	pid := p.cmd.Process.Pid
	storePath := filepath.Join(p.data, "state.db")
	var (
		wg        sync.WaitGroup
		failed    atomic.Int64
		retries   atomic.Int64
		mu        sync.Mutex
		peakRSS   atomic.Int64
		peakAnon  atomic.Int64
		peakFile  atomic.Int64
		peakStore atomic.Int64
		stopPoll  = make(chan struct{})
	)
	go func() {
		for {
			select {
			case <-stopPoll:
				return
			case <-time.After(200 * time.Millisecond):
				_, peak := rss(pid)
				peakRSS.Store(int64(peak))
				st, _ := procmem.ReadStatus(pid)
				peakAnon.Store(max(peakAnon.Load(), int64(st.Anon)))
				peakFile.Store(max(peakFile.Load(), int64(st.File)))
				if kib, err := procmem.MappedKiB(pid, storePath); err == nil {
					peakStore.Store(max(peakStore.Load(), int64(kib)))
				}
			}
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Minute)
	defer cancel()
	sideCtx, stopSide := context.WithCancel(ctx)
	var sideDone sync.WaitGroup
	if side != nil {
		sideDone.Go(func() { side(sideCtx) })
	}
	fail := func(a herdAgent, err error) {
		failed.Add(1)
		mu.Lock()
		if len(r.firstFailures) < 5 {
			r.firstFailures = append(r.firstFailures, fmt.Sprintf("agent %d: %v", a.i, err))
		}
		mu.Unlock()
	}
	counts := &herdCounts{}
	gc0, alloc0 := gcCPU()
	cpu0, self0, children0 := cpu(pid), rusage(syscall.RUSAGE_SELF), rusage(syscall.RUSAGE_CHILDREN)
	start := time.Now()
	// every machine is powered on at the same instant
	gate := make(chan struct{})
	for _, a := range agents {
		a.counts = counts
		wg.Go(func() {
			<-gate
			for attempt := 0; ; attempt++ {
				err := a.join(ctx, p.endpoint)
				if err == nil {
					mu.Lock()
					r.lat = append(r.lat, time.Since(start))
					mu.Unlock()
					return
				}
				if ctx.Err() != nil || !transient(err) {
					fail(a, err)
					return
				}
				retries.Add(1)
				mu.Lock()
				r.causes[retryCause(err)]++
				mu.Unlock()
				wait := agent.RetryWait(attempt, herdBackoffBase, herdBackoffMax, rand.Float64, err)
				select {
				case <-time.After(wait):
				case <-ctx.Done():
				}
			}
		})
	}
	close(gate)
	wg.Wait()
	r.elapsed = time.Since(start)
	r.listenerCPU = cpu(pid) - cpu0
	// the agent processes are waited for, so they are the children counted;
	// the listener is not waited for until the end
	r.inProcCPU, r.procCPU = rusage(syscall.RUSAGE_SELF)-self0, rusage(syscall.RUSAGE_CHILDREN)-children0
	gc1, alloc1 := gcCPU()
	r.inProcGC, r.inProcAlloc, r.procGCs = gc1-gc0, alloc1-alloc0, counts.collections.Load()
	r.peakJoining = counts.peakJoining.Load()
	stopSide()
	sideDone.Wait()
	close(stopPoll)
	cur, peak := rss(pid)
	r.endRSS, r.peakRSS = cur, max(peak, int(peakRSS.Load()))
	// what the listener holds once the herd is done: polled until it stops
	// falling. The Go runtime hands idle memory back over some seconds, and
	// the listener returns it again every 10 s while quic-go still holds
	// closed connections (up to tens of seconds after a herd), so it has
	// settled once 12 s pass without a fall
	settledAt := time.Now()
	r.settled = cur
	for i := range 90 {
		time.Sleep(time.Second)
		now, _ := rss(pid)
		if i == 4 {
			r.after5s = now
		}
		if now < r.settled {
			r.settled, settledAt = now, time.Now()
		} else if time.Since(settledAt) >= 12*time.Second {
			break
		}
	}
	r.settledAfter = settledAt.Sub(start) - r.elapsed
	st, _ := procmem.ReadStatus(pid)
	r.anon, r.file = st.Anon, st.File
	r.peakAnon, r.peakFile = int(peakAnon.Load()), int(peakFile.Load())
	r.storePages, _ = procmem.MappedKiB(pid, storePath)
	r.peakStorePages = int(peakStore.Load())
	if fi, err := os.Stat(storePath); err == nil {
		r.storeBytes = fi.Size()
	}
	r.failed, r.retries = failed.Load(), retries.Load()
	return r
}

// errTransient is a process's exit 3: could not reach the listener, or a
// refusal worth retrying.
var errTransient = errors.New("transient (exit 3)")

// retryCause names a transient failure's kind for the tally.
func retryCause(err error) string {
	var r *agent.RefusedError
	if errors.As(err, &r) {
		return r.Code
	}
	var late *refusedAfterHandshake
	if errors.As(err, &late) {
		return "CONNECTION_REFUSED after the handshake"
	}
	msg := err.Error()
	if i := strings.LastIndex(msg, ": "); i >= 0 {
		msg = msg[i+2:]
	}
	return msg
}

func transient(err error) bool {
	var u *agent.UnreachableError
	var r *agent.RefusedError
	return errors.Is(err, errTransient) || errors.As(err, &u) || (errors.As(err, &r) && r.Retryable())
}

// refusedAfterHandshake is a connection refused once its handshake had
// completed, paid for in vain: quic-go does that to a connection no
// accepter takes in time (see the listener's acceptPool).
type refusedAfterHandshake struct{ err error }

func (e *refusedAfterHandshake) Error() string { return "after the handshake: " + e.err.Error() }
func (e *refusedAfterHandshake) Unwrap() error { return e.err }

// join runs one attempt of the machine's join.
func (a herdAgent) join(ctx context.Context, endpoint string) error {
	if a.process {
		file := a.state + ".secret"
		if _, err := os.Stat(file); err != nil {
			if err := os.WriteFile(file, []byte(a.secret+"\n"), 0o600); err != nil {
				return err
			}
		}
		cmd := exec.CommandContext(ctx, filepath.Join(binDir, "stratum-agent"), "join", "--endpoint", endpoint, "--code-file", file, "--state", a.state, "--root", a.root)
		// the runtime reports each collection on stderr: a real agent
		// process makes none, where the in-process machines share one heap
		// and its collector (the herd reports both)
		cmd.Env = withGCTrace(os.Environ())
		var trace bytes.Buffer
		cmd.Stderr = &trace
		done := a.counts.begin()
		err := cmd.Run()
		done()
		// a trace line may be split around a line of the agent's, never
		// the agent's line: each is one write
		stderr := trace.String()
		a.counts.collections.Add(int64(collections(stderr)))
		var exit *exec.ExitError
		if errors.As(err, &exit) && exit.ExitCode() == 3 {
			if strings.Contains(stderr, "CONNECTION_REFUSED") {
				// turned away busy: what agent.RetryWait caps
				return fmt.Errorf("%w: %w", errTransient, &quic.TransportError{ErrorCode: quic.ConnectionRefused, Remote: true})
			}
			return errTransient
		}
		if err != nil {
			return fmt.Errorf("%w: %s", err, strings.TrimSpace(stderr))
		}
		return nil
	}
	if joiningAtOnce != nil {
		joiningAtOnce <- struct{}{}
		defer func() { <-joiningAtOnce }()
	}
	defer a.counts.begin()()
	sec, err := joincode.Parse(a.secret)
	if err != nil {
		return err
	}
	rep, err := hwid.Collect(ctx, hwid.Config{Root: a.root})
	if err != nil {
		return err
	}
	// forty machines to a /24, a rack behind its switch
	src := net.IPv4(127, byte(20+a.i/(40*250)), byte(a.i/40%250), byte(a.i%40+1))
	// a refusal once the dial returned came after the handshake
	var dialed atomic.Bool
	dial := herdDial(src)
	_, err = agent.Join(ctx, agent.JoinConfig{StateDir: a.state, Endpoint: endpoint, Secret: sec, Facts: rep.Facts, Dial: func(ctx context.Context, ep string, tc *tls.Config, qc *quic.Config) (*quic.Conn, error) {
		c, err := dial(ctx, ep, tc, qc)
		dialed.Store(err == nil)
		return c, err
	}})
	var refused *quic.TransportError
	if dialed.Load() && errors.As(err, &refused) && refused.Remote && refused.ErrorCode == quic.ConnectionRefused {
		return &refusedAfterHandshake{err}
	}
	return err
}

// collections counts the collections a process reported on stderr under
// GODEBUG=gctrace=1: the lines that begin "gc ". The runtime writes each
// trace line in pieces, so the process's own lines can land inside one and
// a process that exits just after a collection can cut its line short;
// but each trace begins with its "gc " after a line's end (one trace never
// interrupts another), and an agent's own lines begin otherwise.
func collections(stderr string) int {
	n := 0
	for line := range strings.SplitSeq(stderr, "\n") {
		if strings.HasPrefix(line, "gc ") {
			n++
		}
	}
	return n
}

// withGCTrace is env with the runtime's trace of collections turned on,
// beside whatever GODEBUG settings env holds.
func withGCTrace(env []string) []string {
	godebug := "gctrace=1"
	var out []string
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "GODEBUG="); ok {
			if v != "" {
				godebug = v + "," + godebug
			}
			continue
		}
		out = append(out, kv)
	}
	return append(out, "GODEBUG="+godebug)
}

// collect is the child of TestCollectionsAreCounted: n collections, then
// a line of its own on stderr.
func collect(n int) {
	for range n {
		runtime.GC()
	}
	fmt.Fprintln(os.Stderr, "stratum-agent: CONNECTION_REFUSED")
}

// The herd counts a process's collections from the runtime's trace, and
// what the harness matches in the process's stderr is left whole.
func TestCollectionsAreCounted(t *testing.T) {
	const n = 3
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = withGCTrace(append(os.Environ(), "GODEBUG=madvdontneed=1", fmt.Sprintf("STRATUM_BENCH_COLLECT=%d", n)))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	// the runtime may collect on its own too, never fewer
	if got := collections(stderr.String()); got < n || got > n+2 {
		t.Errorf("counted %d collections in a child that forced %d:\n%s", got, n, stderr.String())
	}
	// what the harness matches survives the trace written around it
	if !strings.Contains(stderr.String(), "stratum-agent: CONNECTION_REFUSED\n") {
		t.Errorf("the child's own line is not whole in its stderr: %q", stderr.String())
	}
	if env := withGCTrace([]string{"GODEBUG=madvdontneed=1", "HOME=/"}); !slices.Equal(env, []string{"HOME=/", "GODEBUG=madvdontneed=1,gctrace=1"}) {
		t.Errorf("GODEBUG kept and the trace added: %q", env)
	}
}

// gcCPU is the CPU this process's garbage collector has spent (its
// background workers, assists and pauses) and the bytes it has allocated.
func gcCPU() (time.Duration, uint64) {
	s := []metrics.Sample{{Name: "/cpu/classes/gc/total:cpu-seconds"}, {Name: "/gc/heap/allocs:bytes"}}
	metrics.Read(s)
	return time.Duration(s[0].Value.Float64() * 1e9), s[1].Value.Uint64()
}

// herdDial dials from src, as a machine with that address would.
func herdDial(src net.IP) func(context.Context, string, *tls.Config, *quic.Config) (*quic.Conn, error) {
	return func(ctx context.Context, ep string, tc *tls.Config, qc *quic.Config) (*quic.Conn, error) {
		raddr, err := net.ResolveUDPAddr("udp", ep)
		if err != nil {
			return nil, err
		}
		udp, err := net.ListenUDP("udp", &net.UDPAddr{IP: src})
		if err != nil {
			return nil, err
		}
		tr := &quic.Transport{Conn: udp}
		conn, err := tr.Dial(ctx, raddr, tc, qc)
		if err != nil {
			tr.Close()
			return nil, err
		}
		go func() { <-conn.Context().Done(); tr.Close() }()
		return conn, nil
	}
}

// machinesDir holds the herd's machines: their sysfs trees and state
// directories. Each machine of a fleet writes its own disk; here thousands
// would share one, and ext4's inode allocation for their hundred thousand
// small files would be most of the agents' CPU. So they live on tmpfs when
// there is one (their fsyncs are then free: BenchmarkJoinDurableWrites
// counts and costs them), and the listener's store stays on disk.
func machinesDir(b *testing.B) string {
	if dir, err := memoryDir(b); err == nil {
		return dir
	}
	return b.TempDir()
}

func herdUUID(i int) string { return fmt.Sprintf("5e1f0c2a-0000-4000-8000-%012x", i+1) }

// herdRoot writes machine i's sysfs tree under dir.
func herdRoot(b *testing.B, dir string, i int) string {
	root := filepath.Join(dir, "roots", strconv.Itoa(i))
	dmi := filepath.Join(root, "sys", "class", "dmi", "id")
	if err := os.MkdirAll(dmi, 0o755); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dmi, "product_uuid"), []byte(herdUUID(i)+"\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "state"), 0o700); err != nil {
		b.Fatal(err)
	}
	return root
}

// mintTokens mints n joinTokens tokens (maxUses 1) through the admin
// socket, eight requests at a time.
func (p *proc) mintTokens(b *testing.B, n int) []string {
	b.Helper()
	client := socketClient(p.sock)
	tokens := make([]string, n)
	var wg sync.WaitGroup
	var firstErr atomic.Value
	next := atomic.Int64{}
	for range 8 {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				body := fmt.Sprintf(`{"tenantId":"default","poolId":"default","ttlSeconds":7200,"maxUses":1,"idempotencyKey":"herd-%d"}`, i)
				resp, err := client.Post("http://stratum-admin/api/compute/joinTokens/create", "application/json", strings.NewReader(body))
				if err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
				var out struct{ Token string }
				err = json.NewDecoder(resp.Body).Decode(&out)
				resp.Body.Close()
				if err != nil || resp.StatusCode != http.StatusOK {
					firstErr.CompareAndSwap(nil, fmt.Errorf("mint token %d: %d %v", i, resp.StatusCode, err))
					return
				}
				tokens[i] = out.Token
			}
		})
	}
	wg.Wait()
	if err, _ := firstErr.Load().(error); err != nil {
		b.Fatal(err)
	}
	return tokens
}

// mintHeld mints a code whose joins wait for approval (the default).
func (p *proc) mintHeld(b *testing.B, args ...string) string {
	b.Helper()
	var c struct{ Code, ID string }
	p.adminJSON(b, &c, append([]string{"codes", "create", "--json"}, args...)...)
	return c.Code + " " + c.ID
}

func (p *proc) adminJSON(b *testing.B, v any, args ...string) {
	b.Helper()
	cmd := exec.Command(filepath.Join(binDir, "stratum-listener"), args...)
	cmd.Env = append(os.Environ(), "STRATUM_ADMIN_SOCKET="+p.sock)
	out, err := cmd.Output()
	if err != nil {
		b.Fatalf("%v: %v", args, err)
	}
	if err := json.Unmarshal(out, v); err != nil {
		b.Fatalf("%v: %v", args, err)
	}
}

// approveLoop is the operator's approval script: once a second it lists
// the pending joins and approves each whose machine is in the inventory.
func approveLoop(ctx context.Context, b *testing.B, p *proc, inventory map[string]bool, approved *atomic.Int64) {
	client := socketClient(p.sock)
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://stratum-admin/v1/admin/cluster/joins", nil)
		resp, err := client.Do(req)
		if err != nil {
			continue
		}
		var list struct {
			Items []struct {
				ID    string
				State string
				Facts struct{ ProductUUID string }
			}
		}
		err = json.NewDecoder(resp.Body).Decode(&list)
		resp.Body.Close()
		if err != nil {
			b.Logf("approver: list joins: %v", err)
			continue
		}
		for _, j := range list.Items {
			// hwid reports the UUID as SMBIOS spells it, upper case
			if j.State != "pending" || !inventory[strings.ToLower(j.Facts.ProductUUID)] {
				continue
			}
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://stratum-admin/v1/admin/cluster/joins/"+j.ID+"/approve", nil)
			resp, err := client.Do(req)
			if err != nil {
				continue
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				b.Logf("approver: approve %s: %d %s", j.ID, resp.StatusCode, body)
				continue
			}
			approved.Add(1)
		}
	}
}
