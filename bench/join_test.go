package bench

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stratumjoin/stratum/agent"
	"github.com/stratumjoin/stratum/internal/joincode"
	"github.com/stratumjoin/stratum/internal/pake"
	"github.com/stratumjoin/stratum/internal/wire"
)

func freeUDP(tb testing.TB) string {
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer c.Close()
	return c.LocalAddr().String()
}

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

// joins runs n sequential joins with one code; it returns each latency
// and the listener's CPU time over them.
func joins(b *testing.B, p *proc, code string, n int) ([]time.Duration, time.Duration) {
	sec, err := joincode.Parse(strings.Fields(code)[0])
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	var lat []time.Duration
	cpu0 := cpu(p.cmd.Process.Pid)
	for i := range n {
		state := filepath.Join(dir, fmt.Sprint(i))
		// the node key is made before the clock starts, as on a node
		if _, err := (agent.State{Dir: state}).Key(); err != nil {
			b.Fatal(err)
		}
		t0 := time.Now()
		if _, err := agent.Join(context.Background(), agent.JoinConfig{StateDir: state, Endpoint: p.endpoint, Secret: sec}); err != nil {
			b.Fatalf("join %d: %v", i, err)
		}
		lat = append(lat, time.Since(t0))
	}
	return lat, cpu(p.cmd.Process.Pid) - cpu0
}

// BenchmarkJoinFigures logs join latency with the default and the
// lightest Argon2id parameters, and the listener's CPU per join next to
// the floor measured in the same run.
func BenchmarkJoinFigures(b *testing.B) {
	const n = 200
	var listenerCPU []time.Duration
	for _, tc := range []struct {
		name  string
		light bool
		ksf   pake.KSFParams
		serve []string
	}{
		{"argon2id-t3-64MiB-p4 (default)", false, pake.DefaultKSF, nil},
		{"argon2id-t1-8MiB-p1 (lightest)", true, pake.LightestKSF, nil},
		// every agent here comes from 127.0.0.1, so above 20 joins/s each
		// one answers a Retry; a fleet's agents have addresses of their own
		{"argon2id-t1-8MiB-p1, no Retry (--retry-above 100000)", true, pake.LightestKSF, []string{"--retry-above", "100000"}},
	} {
		p := startListener(b, tc.light, tc.serve...)
		code := p.mint(b, "--max-uses", "0", "--ttl", "1h")
		lat, used := joins(b, p, code, n)
		ksf := ksfTime(b, tc.ksf)
		listenerCPU = append(listenerCPU, used/n)
		b.Logf("%s: %d joins: p50 %s, p99 %s; client KSF alone %s, so p50 without it %s; listener CPU %s per join",
			tc.name, n, ms(percentile(lat, .5)), ms(percentile(lat, .99)), ms(ksf), ms(percentile(lat, .5)-ksf), ms(used/n))
	}

	// the floor: handshake + KE2 + one signature in a bare server process
	floor := exec.Command(os.Args[0], "-test.run=^$")
	floor.Env = append(os.Environ(), "STRATUM_BENCH_FLOOR=1")
	stdin, _ := floor.StdinPipe()
	stdout, _ := floor.StdoutPipe()
	floor.Stderr = os.Stderr
	if err := floor.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { stdin.Close(); floor.Wait() }()
	addr, _ := bufio.NewReader(stdout).ReadString('\n')
	addr = strings.TrimSpace(addr)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	csr, _ := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	cpu0 := cpu(floor.Process.Pid)
	for range n {
		if err := floorClient(context.Background(), addr, csr); err != nil {
			b.Fatal(err)
		}
	}
	floorCPU := (cpu(floor.Process.Pid) - cpu0) / n
	b.Logf("floor (QUIC server handshake + OPAQUE KE2 + one signature): %s CPU per exchange; the listener used %.1fx, %.1fx and %.1fx of it in the three runs above",
		ms(floorCPU), float64(listenerCPU[0])/float64(floorCPU), float64(listenerCPU[1])/float64(floorCPU), float64(listenerCPU[2])/float64(floorCPU))
}

// BenchmarkListenerMemory logs the listener's RSS after 1,000 joins.
func BenchmarkListenerMemory(b *testing.B) {
	p := startListener(b, true)
	code := p.mint(b, "--max-uses", "0", "--ttl", "1h")
	before, _ := rss(p.cmd.Process.Pid)
	lat, _ := joins(b, p, code, 1000)
	cur, peak := rss(p.cmd.Process.Pid)
	b.Logf("listener RSS: %d KiB at start, %d KiB after 1,000 joins (peak %d KiB); join p50 %s p99 %s", before, cur, peak, ms(percentile(lat, .5)), ms(percentile(lat, .99)))
}
