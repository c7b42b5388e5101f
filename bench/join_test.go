package bench

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/stratumjoin/stratum/agent"
	"github.com/stratumjoin/stratum/internal/joincode"
	"github.com/stratumjoin/stratum/internal/pake"
	"github.com/stratumjoin/stratum/internal/testenv"
	"github.com/stratumjoin/stratum/internal/wire"
)

func percentile(d []time.Duration, p float64) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	if len(s) == 0 {
		return 0
	}
	return s[int(math.Min(float64(len(s)-1), p*float64(len(s))))]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/1e6) }

// ksfTime is the client's key stretching cost for p, measured alone: the
// median of 21 client login finishes, which is almost all KSF.
func ksfTime(b *testing.B, p pake.KSFParams) time.Duration {
	k, _ := pake.GenerateServerKeys()
	fp := make([]byte, 32)
	rec, err := k.Mint("AB", []byte("AB000000000"), fp, p)
	if err != nil {
		b.Fatal(err)
	}
	var d []time.Duration
	for range 21 {
		ctx := wire.BindingContext(make([]byte, 32))
		cl, ke1, _ := pake.Start(ctx, "AB", []byte("AB000000000"))
		ke2, _, _ := k.Respond(ctx, fp, "AB", ke1, rec)
		t0 := time.Now()
		if _, _, err := cl.Finish(ke2, fp, p); err != nil {
			b.Fatal(err)
		}
		d = append(d, time.Since(t0))
	}
	return percentile(d, .5)
}

// joins runs n joins with one secret, width at a time (1: sequential);
// it returns each latency and the listener's CPU time over them.
func joins(b *testing.B, p *proc, secret string, n, width int) ([]time.Duration, time.Duration) {
	sec, err := joincode.Parse(strings.Fields(secret)[0])
	if err != nil {
		b.Fatal(err)
	}
	lat, used, err := inProcessJoins(b.TempDir(), p.cmd.Process.Pid, p.endpoint, sec, n, width, false)
	if err != nil {
		b.Fatal(err)
	}
	return lat, used
}

// inProcessJoins runs n joins of the real agent with sec against the
// server process pid (a listener or a floor) at endpoint, width at a time,
// each agent's state in its own directory under dir; it returns each
// latency, the server's CPU time over them and the first failure. With
// retryRefused a handshake the server refuses past its accept queue, as a
// bare quic-go server does in a wide wave, is tried again; a listener's
// joins get no second try. For any goroutine.
func inProcessJoins(dir string, pid int, endpoint string, sec joincode.Secret, n, width int, retryRefused bool) ([]time.Duration, time.Duration, error) {
	// the node keys are made before the clock starts, as on a node
	for i := range n {
		if _, err := (agent.State{Dir: filepath.Join(dir, fmt.Sprint(i))}).Key(); err != nil {
			return nil, 0, err
		}
	}
	lat := make([]time.Duration, n)
	next := make(chan int, n)
	for i := range n {
		next <- i
	}
	close(next)
	errs := make(chan error, width)
	cpu0 := cpu(pid)
	for range width {
		go func() {
			for i := range next {
				t0 := time.Now()
				cfg := agent.JoinConfig{StateDir: filepath.Join(dir, fmt.Sprint(i)), Endpoint: endpoint, Secret: sec}
				_, err := agent.Join(context.Background(), cfg)
				for tries := 0; retryRefused && err != nil && tries < 100 && isRefused(err); tries++ {
					time.Sleep(10 * time.Millisecond)
					t0 = time.Now()
					_, err = agent.Join(context.Background(), cfg)
				}
				if err != nil {
					errs <- fmt.Errorf("join %d: %w", i, err)
					return
				}
				lat[i] = time.Since(t0)
			}
			errs <- nil
		}()
	}
	var first error
	for range width {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return lat, cpu(pid) - cpu0, first
}

// floorAgentCPU runs n joins of the real agent with sec, width at a time,
// against the floor server floor listening at addr, and returns the
// floor's CPU per join; for any goroutine. The agents' state goes under
// dir, which, like the listener's agents' state, stays until the
// benchmark ends, so that no removal runs between measurements.
func floorAgentCPU(dir string, floor *exec.Cmd, addr string, sec joincode.Secret, n, width int) (time.Duration, error) {
	_, used, err := inProcessJoins(dir, floor.Process.Pid, addr, sec, n, width, true)
	return used / time.Duration(n), err
}

// startFloor runs this test binary as the floor server with env; it
// serves until the benchmark ends. It returns the process and its address.
func startFloor(b testing.TB, env ...string) (*exec.Cmd, string) {
	b.Helper()
	floor := exec.Command(os.Args[0], "-test.run=^$")
	floor.Env = append(os.Environ(), env...)
	stdin, _ := floor.StdinPipe()
	stdout, _ := floor.StdoutPipe()
	floor.Stderr = os.Stderr
	if err := floor.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { stdin.Close(); floor.Wait() })
	addr, _ := bufio.NewReader(stdout).ReadString('\n')
	return floor, strings.TrimSpace(addr)
}

// instantFloorCPU runs n exchanges of the instant floor client (no agent
// work between its messages), width at a time, against the floor server
// floor listening at addr and returns the floor's CPU per exchange.
func instantFloorCPU(b *testing.B, floor *exec.Cmd, addr string, n, width int) time.Duration {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	csr, _ := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	next := make(chan struct{}, n)
	for range n {
		next <- struct{}{}
	}
	close(next)
	errs := make(chan error, width)
	cpu0 := cpu(floor.Process.Pid)
	for range width {
		go func() {
			for range next {
				err := floorClient(context.Background(), addr, csr)
				// a bare quic-go server refuses handshakes past its accept
				// queue; in a wide wave those are tried again
				for tries := 0; err != nil && tries < 100 && isRefused(err); tries++ {
					time.Sleep(10 * time.Millisecond)
					err = floorClient(context.Background(), addr, csr)
				}
				if err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range width {
		if err := <-errs; err != nil {
			b.Fatal(err)
		}
	}
	return (cpu(floor.Process.Pid) - cpu0) / time.Duration(n)
}

func isRefused(err error) bool {
	var te *quic.TransportError
	return errors.As(err, &te) && te.ErrorCode == quic.ConnectionRefused
}

// BenchmarkJoinFigures logs join latency with the default and the
// lightest Argon2id parameters and with a join token, and the listener's
// CPU per join next to the floor measured in the same run, for sequential
// joins and for a wave of joins at once. Beside each sequential case runs
// the same listener with its store on tmpfs, which splits the listener's
// cost over the floor into the disk's part and its own.
func BenchmarkJoinFigures(b *testing.B) {
	const n, wave, width = 200, 400, 32
	// every agent here comes from 127.0.0.1, so above 20 joins/s each
	// one answers a Retry; a fleet's agents have addresses of their own
	noRetry := []string{"--retry-above", "100000"}
	// The floor: handshake + KE2 + one signature in a bare server process,
	// and beside it the same plus the durable writes this design makes per
	// join on the disk the listener's store uses: for a code the count
	// before the KE2 and the record before the Result, for a token the
	// record alone (its start is counted only if it fails). Each case runs
	// in blocks interleaved with blocks of every floor, so a machine whose
	// speed drifts during the run moves the case and its floors together.
	//
	// The real agent joins each floor as it joins the listener, with a
	// secret of the case's kind and KSF: a server's CPU per exchange
	// depends on its client, since every wait on the peer (the agent's
	// KSF, its CSR, its fsyncs) lets the server's threads park and costs
	// their wake-up, and a floor joined by an instant client is one no
	// listener ever serves. That floor is logged too, as the bench
	// measured it before.
	floor, floorAddr := startFloor(b, "STRATUM_BENCH_FLOOR=1")
	durableCode, durableCodeAddr := startFloor(b, "STRATUM_BENCH_FLOOR=durable", "STRATUM_BENCH_FLOOR_DIR="+b.TempDir())
	durableToken, durableTokenAddr := startFloor(b, "STRATUM_BENCH_FLOOR=durable", "STRATUM_BENCH_FLOOR_WRITES=1", "STRATUM_BENCH_FLOOR_DIR="+b.TempDir())
	// and the same writes made as the listener makes them, as transactions
	// on its bbolt store (two fdatasyncs and a page per key and tree level
	// each): the rest of the listener's cost is its own
	storeCode, storeCodeAddr := startFloor(b, "STRATUM_BENCH_FLOOR=durable", "STRATUM_BENCH_FLOOR_STORE=bolt", "STRATUM_BENCH_FLOOR_DIR="+b.TempDir())
	storeToken, storeTokenAddr := startFloor(b, "STRATUM_BENCH_FLOOR=durable", "STRATUM_BENCH_FLOOR_STORE=bolt", "STRATUM_BENCH_FLOOR_WRITES=1", "STRATUM_BENCH_FLOOR_DIR="+b.TempDir())
	const blocks = 4
	for _, tc := range []struct {
		name  string
		token bool
		ksf   pake.KSFParams
		serve []string
		width int
	}{
		{"code argon2id-t3-64MiB-p4 (the old default)", false, pake.DefaultKSF, nil, 1},
		{"code argon2id-t1-8MiB-p1 (the default, and the lightest)", false, pake.LightestKSF, nil, 1},
		{"code argon2id-t1-8MiB-p1, no Retry (--retry-above 100000)", false, pake.LightestKSF, noRetry, 1},
		{"token (identity KSF), no Retry", true, pake.KSFParams{}, noRetry, 1},
		{"token (identity KSF), with Retry (default --retry-above)", true, pake.KSFParams{}, nil, 1},
		// every serve flag at its default: the budget of unproven starts
		// charges a code's start (in the commit that counts it; its
		// refund rides in the join's), and not a token's
		{"code argon2id-t1-8MiB-p1, every serve default (budget of unproven starts on)", false, pake.LightestKSF, []string{"--unproven-per-source=8", "--connections-per-source=64"}, 1},
		{"token (identity KSF), every serve default (budget of unproven starts on)", true, pake.KSFParams{}, []string{"--unproven-per-source=8", "--connections-per-source=64"}, 1},
		{fmt.Sprintf("token wave, %d at once, no Retry", width), true, pake.KSFParams{}, noRetry, width},
	} {
		// the listener pins the case's parameters for its codes
		var initArgs []string
		if !tc.token {
			initArgs = []string{"--code-ksf", fmt.Sprintf("%d,%d,%d", tc.ksf.Time, tc.ksf.MemoryKiB, tc.ksf.Threads)}
		}
		mint := func(p *proc) string {
			if tc.token {
				return p.mintToken(b, 10000, "bench-figures")
			}
			return p.mint(b, "--max-uses", "0", "--ttl", "1h")
		}
		p := startListenerInit(b, initArgs, tc.serve...)
		secret := mint(p)
		// Beside a sequential case, the same listener with its store in
		// memory (tmpfs), where its page writes and fdatasyncs reach no
		// disk: what it saves is what the disk costs the listener, the
		// flushes of its commits above all, and the rest of its cost over
		// the floor is its own.
		var inMemory *proc
		var inMemorySecret string
		if tc.width == 1 {
			dir, err := memoryDir(b)
			if err != nil {
				b.Fatal(err)
			}
			inMemory = startListenerIn(b, dir, initArgs, tc.serve...)
			inMemorySecret = mint(inMemory)
		}
		count := n
		if tc.width > 1 {
			count = wave
		}
		var lat []time.Duration
		var used, floorUsed, instantUsed, durableUsed, storeUsed, inMemoryUsed time.Duration
		var blockRatios []float64
		durable, durableAddr, stored, storedAddr, writes := durableCode, durableCodeAddr, storeCode, storeCodeAddr, 2
		if tc.token {
			durable, durableAddr, stored, storedAddr, writes = durableToken, durableTokenAddr, storeToken, storeTokenAddr, 1
		}
		per := count / blocks
		floorSec := floorSecret(tc.token, tc.ksf)
		agentFloor := func(srv *exec.Cmd, addr string) time.Duration {
			d, err := floorAgentCPU(b.TempDir(), srv, addr, floorSec, per, tc.width)
			if err != nil {
				b.Fatal(err)
			}
			return d
		}
		for range blocks {
			fi := instantFloorCPU(b, floor, floorAddr, per, tc.width)
			f := agentFloor(floor, floorAddr)
			d := agentFloor(durable, durableAddr)
			st := agentFloor(stored, storedAddr)
			l, u := joins(b, p, secret, per, tc.width)
			lat, used = append(lat, l...), used+u
			if inMemory != nil {
				_, m := joins(b, inMemory, inMemorySecret, per, tc.width)
				inMemoryUsed += m
			}
			floorUsed, instantUsed, durableUsed, storeUsed = floorUsed+f, instantUsed+fi, durableUsed+d, storeUsed+st
			blockRatios = append(blockRatios, float64(u)/float64(per)/float64(f))
		}
		sort.Float64s(blockRatios)
		listenerPer, floorPer := used/time.Duration(count), floorUsed/blocks
		ratio := func(floor time.Duration) float64 { return float64(listenerPer) / float64(floor/blocks) }
		figures := fmt.Sprintf("listener CPU %s per join; floor %s, %.2fx it (blocks %.2fx to %.2fx); floor with its durable writes (%d) %s, %.2fx it; floor with them as the listener's bbolt transactions %s, %.2fx it; floor with an instant client rather than the agent %s, %.2fx it",
			ms(listenerPer), ms(floorPer), ratio(floorUsed), blockRatios[0], blockRatios[len(blockRatios)-1], writes, ms(durableUsed/blocks), ratio(durableUsed), ms(storeUsed/blocks), ratio(storeUsed), ms(instantUsed/blocks), ratio(instantUsed))
		if inMemory != nil {
			inMemoryPer := inMemoryUsed / time.Duration(count)
			figures += fmt.Sprintf("; the listener with its store in memory %s, %.2fx the floor, so the disk under its store takes %.2fx",
				ms(inMemoryPer), float64(inMemoryPer)/float64(floorPer), float64(listenerPer-inMemoryPer)/float64(floorPer))
		}
		if tc.token {
			b.Logf("%s: %d joins: p50 %s, p99 %s; %s", tc.name, count, ms(percentile(lat, .5)), ms(percentile(lat, .99)), figures)
			continue
		}
		ksf := ksfTime(b, tc.ksf)
		b.Logf("%s: %d joins: p50 %s, p99 %s; client KSF alone %s, so p50 without it %s; %s",
			tc.name, count, ms(percentile(lat, .5)), ms(percentile(lat, .99)), ms(ksf), ms(percentile(lat, .5)-ksf), figures)
	}
}

// BenchmarkListenerMemory logs the listener's RSS after 1,000 joins.
func BenchmarkListenerMemory(b *testing.B) {
	p := startListener(b, true)
	code := p.mint(b, "--max-uses", "0", "--ttl", "1h")
	before, _ := rss(p.cmd.Process.Pid)
	lat, _ := joins(b, p, code, 1000, 1)
	cur, peak := rss(p.cmd.Process.Pid)
	b.Logf("listener RSS: %d KiB at start, %d KiB after 1,000 joins (peak %d KiB); join p50 %s p99 %s", before, cur, peak, ms(percentile(lat, .5)), ms(percentile(lat, .99)))
}

// BenchmarkHeldConnections logs what a join connection waiting on its
// agent costs the listener, the state most of a herd's connections are in
// at its peak: n agents finish the handshake and read their Challenge,
// then hold the connection without sending the Proof, as agents starved
// of CPU do. It logs the listener's RSS, goroutines and stack memory (its
// /metrics) before and while they are held, per held connection.
func BenchmarkHeldConnections(b *testing.B) {
	const n = 400
	metrics := testenv.FreeTCP(b)
	p := startListenerInit(b, nil, "--retry-above", "100000", "--metrics", metrics)
	tokens := p.mintTokens(b, n)
	before, _ := rss(p.cmd.Process.Pid)
	goBefore, stackBefore := goMetric(b, metrics, "go_goroutines"), goMetric(b, metrics, "go_memstats_stack_inuse_bytes")
	held := make(chan error, n)
	release := make(chan struct{})
	var wg sync.WaitGroup
	for _, token := range tokens {
		wg.Go(func() { holdAtChallenge(p.endpoint, token, held, release) })
	}
	defer func() { close(release); wg.Wait() }()
	for range n {
		if err := <-held; err != nil {
			b.Fatal(err)
		}
	}
	// the listener's memory settles once every Challenge has gone out
	time.Sleep(2 * time.Second)
	cur, _ := rss(p.cmd.Process.Pid)
	goHeld, stackHeld := goMetric(b, metrics, "go_goroutines"), goMetric(b, metrics, "go_memstats_stack_inuse_bytes")
	b.Logf("%d join connections held awaiting their Proof: listener RSS %d KiB before, %d KiB while held: %.1f KiB a connection, of it %.1f KiB of stacks for %.1f goroutines",
		n, before, cur, float64(cur-before)/n, (stackHeld-stackBefore)/1024/n, (goHeld-goBefore)/n)
}

// holdAtChallenge joins up to the Challenge, reports on held, and keeps
// the connection open until release closes.
func holdAtChallenge(endpoint, token string, held chan<- error, release <-chan struct{}) {
	sec, err := joincode.Parse(token)
	if err != nil {
		held <- err
		return
	}
	ctx := context.Background()
	conn, err := quic.DialAddr(ctx, endpoint, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{wire.ALPNJoin}, MinVersion: tls.VersionTLS13},
		&quic.Config{HandshakeIdleTimeout: 10 * time.Second, MaxIdleTimeout: time.Minute, KeepAlivePeriod: 5 * time.Second})
	if err != nil {
		held <- err
		return
	}
	defer conn.CloseWithError(0, "")
	_, err = helloChallenge(ctx, conn, sec.Locator, sec.Password())
	held <- err
	<-release
}

// goMetric reads one unlabelled gauge from the listener's /metrics.
func goMetric(b *testing.B, addr, name string) float64 {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 2 && f[0] == name {
			v, err := strconv.ParseFloat(f[1], 64)
			if err != nil {
				b.Fatal(err)
			}
			return v
		}
	}
	b.Fatalf("/metrics has no %s", name)
	return 0
}
