package bench

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// syncCalls are the system calls that make data durable.
const syncCalls = "fsync,fdatasync,sync_file_range,msync,syncfs"

// BenchmarkJoinDurableWrites counts the durable writes one join makes on
// each side, with real processes (the listener as a service, each agent a
// one-shot `stratum-agent join`), and measures what one costs on the file
// system the data lives on: the part of the join's floor that safety, not
// CPU, sets. It needs strace (Debian: strace).
func BenchmarkJoinDurableWrites(b *testing.B) {
	const joinsN = 30
	if _, err := exec.LookPath("strace"); err != nil {
		b.Fatalf("strace is needed to count the durable writes (apt-get install strace): %v", err)
	}
	p := startListener(b, true)
	code := strings.Fields(p.mint(b, "--max-uses", "0", "--ttl", "1h"))[0]
	codeFile := filepath.Join(b.TempDir(), "code")
	if err := os.WriteFile(codeFile, []byte(code), 0o600); err != nil {
		b.Fatal(err)
	}

	// strace -c on the running listener counts its calls until detached
	summary := filepath.Join(b.TempDir(), "listener.strace")
	tracer := exec.Command("strace", "-f", "-c", "-o", summary, "-e", "trace="+syncCalls, "-p", strconv.Itoa(p.cmd.Process.Pid))
	if err := tracer.Start(); err != nil {
		b.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // let strace attach to every thread before the first join

	var agentSyncs int
	dir := b.TempDir()
	join := func(i int, traced bool) {
		args := []string{filepath.Join(binDir, "stratum-agent"), "join", "--endpoint", p.endpoint, "--code-file", codeFile,
			"--state", filepath.Join(dir, fmt.Sprint(i)), "--root", machineRoot(b, i)}
		out := filepath.Join(dir, fmt.Sprintf("agent-%d.strace", i))
		if traced {
			args = append([]string{"strace", "-f", "-c", "-o", out, "-e", "trace=" + syncCalls}, args...)
		}
		if msg, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			b.Fatalf("join %d: %v\n%s", i, err, msg)
		}
		if traced {
			agentSyncs += straceCalls(b, out)
		}
	}
	for i := range joinsN {
		join(i, true)
	}
	_ = tracer.Process.Signal(syscall.SIGINT)
	_ = tracer.Wait()
	listenerSyncs := straceCalls(b, summary)

	// a wave: the same number of joins, ten at a time, so the listener's
	// group commit can share fsyncs between them
	waveSummary := filepath.Join(b.TempDir(), "wave.strace")
	tracer = exec.Command("strace", "-f", "-c", "-o", waveSummary, "-e", "trace="+syncCalls, "-p", strconv.Itoa(p.cmd.Process.Pid))
	if err := tracer.Start(); err != nil {
		b.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // let strace attach to every thread before the wave
	var wg sync.WaitGroup
	sem := make(chan struct{}, 10)
	for i := joinsN; i < 2*joinsN; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func() { defer wg.Done(); join(i, false); <-sem }()
	}
	wg.Wait()
	_ = tracer.Process.Signal(syscall.SIGINT)
	_ = tracer.Wait()
	waveSyncs := straceCalls(b, waveSummary)
	b.Logf("listener durable writes per join in a wave of %d joins, 10 at a time: %.1f", joinsN, float64(waveSyncs)/joinsN)

	cost := syncCost(b, p.data, 200)
	b.Logf("durable writes per join: listener %.1f, agent %.1f (%d joins, strace -c on %s)",
		float64(listenerSyncs)/joinsN, float64(agentSyncs)/joinsN, joinsN, syncCalls)
	b.Logf("one 4 KiB write + fdatasync on the data dir's file system: p10 %s p50 %s p90 %s (n=200); so the durable writes alone set a floor of about %s per join",
		ms(percentile(cost, .1)), ms(percentile(cost, .5)), ms(percentile(cost, .9)),
		ms(time.Duration(float64(listenerSyncs+agentSyncs)/joinsN*float64(percentile(cost, .5)))))
}

// machineRoot makes a DMI tree with a product UUID of its own, so each
// agent process is a machine of its own rather than this one rejoining.
func machineRoot(b *testing.B, i int) string {
	root := b.TempDir()
	dmi := filepath.Join(root, "sys", "class", "dmi", "id")
	if err := os.MkdirAll(dmi, 0o755); err != nil {
		b.Fatal(err)
	}
	uuid := fmt.Sprintf("5e1f0c2a-0000-4000-8000-%012x", i+1)
	if err := os.WriteFile(filepath.Join(dmi, "product_uuid"), []byte(uuid+"\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	return root
}

var straceTotal = regexp.MustCompile(`(?m)^\s*[0-9.]+\s+[0-9.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?total$`)

// straceCalls reads the total call count from an `strace -c` summary.
func straceCalls(b *testing.B, path string) int {
	out, err := os.ReadFile(path)
	if err != nil {
		b.Fatal(err)
	}
	m := straceTotal.FindSubmatch(out)
	if m == nil {
		if strings.Contains(string(out), "total") {
			b.Fatalf("cannot read the strace summary %s:\n%s", path, out)
		}
		return 0 // no call traced at all
	}
	n, _ := strconv.Atoi(string(m[1]))
	return n
}

// syncCost times n appends of 4 KiB, each followed by fdatasync, in dir.
func syncCost(b *testing.B, dir string, n int) []time.Duration {
	f, err := os.CreateTemp(dir, "synccost")
	if err != nil {
		b.Fatal(err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	buf := make([]byte, 4096)
	var d []time.Duration
	for range n {
		t0 := time.Now()
		if _, err := f.Write(buf); err != nil {
			b.Fatal(err)
		}
		if err := syscall.Fdatasync(int(f.Fd())); err != nil {
			b.Fatal(err)
		}
		d = append(d, time.Since(t0))
	}
	return d
}
