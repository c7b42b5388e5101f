package bench

import (
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stratumjoin/stratum/agent"
	"github.com/stratumjoin/stratum/internal/joincode"
)

// BenchmarkHerd starts STRATUM_HERD agents (default 300; `make herd` sets
// 10,000) at once against one listener process. Each agent retries
// transient failures with the service's jittered backoff, as `stratum-agent
// run` would. It logs failures, codes over their uses, listener memory and
// latency percentiles.
func BenchmarkHerd(b *testing.B) {
	n := 300
	if v := os.Getenv("STRATUM_HERD"); v != "" {
		n, _ = strconv.Atoi(v)
	}
	var lim syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim) == nil && lim.Cur < uint64(n)+4096 {
		lim.Cur = min(lim.Max, uint64(n)+4096)
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	}
	p := startListener(b, true)
	// at most 10 codes: each admits 10 attempts in flight, which bounds how
	// many agents run their key stretching at once on this one machine
	perCode := max(100, (n+9)/10)
	codes := (n + perCode - 1) / perCode
	var secrets []joincode.Secret
	var ids []string
	for range codes {
		f := strings.Fields(p.mint(b, "--max-uses", strconv.Itoa(perCode), "--ttl", "2h"))
		sec, _ := joincode.Parse(f[0])
		secrets, ids = append(secrets, sec), append(ids, f[1])
	}
	dir := b.TempDir()
	var (
		wg       sync.WaitGroup
		failed   atomic.Int32
		retries  atomic.Int32
		mu       sync.Mutex
		lat      []time.Duration
		peakRSS  atomic.Int64
		stopPoll = make(chan struct{})
	)
	go func() {
		for {
			select {
			case <-stopPoll:
				return
			case <-time.After(200 * time.Millisecond):
				_, peak := rss(p.cmd.Process.Pid)
				peakRSS.Store(int64(peak))
			}
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Minute)
	defer cancel()
	start := time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			state := filepath.Join(dir, strconv.Itoa(i))
			t0 := time.Now()
			for attempt := 0; ; attempt++ {
				_, err := agent.Join(ctx, agent.JoinConfig{StateDir: state, Endpoint: p.endpoint, Secret: secrets[i%codes], DialTimeout: 20 * time.Second})
				if err == nil {
					mu.Lock()
					lat = append(lat, time.Since(t0))
					mu.Unlock()
					return
				}
				var u *agent.UnreachableError
				var r *agent.RefusedError
				if ctx.Err() != nil || !(errors.As(err, &u) || (errors.As(err, &r) && r.Retryable())) {
					failed.Add(1)
					b.Logf("agent %d: %v", i, err)
					return
				}
				retries.Add(1)
				time.Sleep(agent.Backoff(attempt, 200*time.Millisecond, 10*time.Second, randFloat()))
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(stopPoll)
	cur, peak := rss(p.cmd.Process.Pid)
	if int64(peak) < peakRSS.Load() {
		peak = int(peakRSS.Load())
	}
	over := 0
	for _, id := range ids {
		cmd := exec.Command(filepath.Join(binDir, "stratum-listener"), "codes", "show", id, "--json")
		cmd.Env = append(os.Environ(), "STRATUM_ADMIN_SOCKET="+p.sock)
		out, err := cmd.Output()
		if err != nil {
			b.Fatal(err)
		}
		var c struct{ Uses, MaxUses, Registrations int }
		json.Unmarshal(out, &c)
		if c.Uses > c.MaxUses || c.Registrations > c.MaxUses {
			over++
		}
	}
	b.Logf("herd of %d agents (%d codes x %d uses): %d failed, %d codes over their uses, %d transient retries; all joined in %s (%.0f joins/s); latency p50 %s p90 %s p99 %s max %s; listener RSS %d KiB now, peak %d KiB",
		n, codes, perCode, failed.Load(), over, retries.Load(), elapsed.Round(time.Millisecond), float64(n)/elapsed.Seconds(),
		ms(percentile(lat, .5)), ms(percentile(lat, .9)), ms(percentile(lat, .99)), ms(percentile(lat, 1)), cur, peak)
	if failed.Load() != 0 || over != 0 {
		b.Fatalf("herd: %d failures, %d codes over their uses", failed.Load(), over)
	}
}

func randFloat() float64 { return rand.Float64() }
