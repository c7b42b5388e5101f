package bench

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stratumjoin/stratum/internal/procmem"
	"github.com/stratumjoin/stratum/internal/testbin"
	"github.com/stratumjoin/stratum/internal/testenv"
)

var binDir string

func TestMain(m *testing.M) {
	if os.Getenv("STRATUM_BENCH_FLOOR") != "" {
		os.Exit(runFloorServer())
	}
	if os.Getenv("STRATUM_BENCH_SPIN") != "" {
		spin()
		return
	}
	if n, err := strconv.Atoi(os.Getenv("STRATUM_BENCH_COLLECT")); err == nil {
		collect(n)
		return
	}
	flag.Parse()
	if f := flag.Lookup("test.bench"); f == nil || f.Value.String() == "" {
		os.Exit(m.Run()) // no benchmark selected: nothing to build
	}
	os.Exit(testbin.Run(m, &binDir, "./cmd/stratum-listener", "./cmd/stratum-agent", "./bench/floorclient"))
}

// cpu counts a process's CPU to well under a tick, threads that have
// ended included, and agrees with what the kernel reports once the
// process is waited for.
func TestCPUIsTheProcessCPUClock(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "STRATUM_BENCH_SPIN=1")
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || line != "spun\n" {
		t.Fatalf("child said %q: %v", line, err)
	}
	running := cpu(cmd.Process.Pid)
	if running < 600*time.Millisecond || running > 900*time.Millisecond {
		t.Errorf("cpu of a child whose two threads, now ended, spun 300 ms each: %v", running)
	}
	if running%(10*time.Millisecond) == 0 {
		t.Errorf("cpu %v is a whole number of ticks: not the CPU clock", running)
	}
	stdin.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	waited := time.Duration(syscall.TimevalToNsec(ru.Utime) + syscall.TimevalToNsec(ru.Stime))
	if waited < running || waited-running > 20*time.Millisecond {
		t.Errorf("cpu said %v while the child waited; the kernel's total once it ended is %v", running, waited)
	}
}

type proc struct {
	cmd      *exec.Cmd
	data     string
	sock     string
	endpoint string
	once     sync.Once
}

func startListener(b *testing.B, light bool, serveArgs ...string) *proc {
	b.Helper()
	var initArgs []string
	if light {
		initArgs = []string{"--light-ksf"}
	}
	return startListenerInit(b, initArgs, serveArgs...)
}

// startListenerInit is startListener with init flags of its own.
func startListenerInit(b *testing.B, initArgs []string, serveArgs ...string) *proc {
	b.Helper()
	return startListenerIn(b, b.TempDir(), initArgs, serveArgs...)
}

// startListenerIn is startListenerInit with its data directory, store
// included, under dir.
func startListenerIn(b *testing.B, dir string, initArgs []string, serveArgs ...string) *proc {
	b.Helper()
	sockDir, _ := os.MkdirTemp("/tmp", "sjb")
	b.Cleanup(func() { os.RemoveAll(sockDir) })
	p := &proc{data: filepath.Join(dir, "l"), sock: filepath.Join(sockDir, "admin.sock"), endpoint: testenv.FreeUDP(b)}
	args := append([]string{"init", "--data", p.data, "--endpoint", p.endpoint}, initArgs...)
	if out, err := exec.Command(filepath.Join(binDir, "stratum-listener"), args...).CombinedOutput(); err != nil {
		b.Fatalf("init: %v %s", err, out)
	}
	// the default log level, as a service runs: a line for each join's
	// event, into a file as into the journal (the tail is shown if the
	// benchmark fails)
	p.cmd = exec.Command(filepath.Join(binDir, "stratum-listener"), "serve", "--data", p.data, "--listen", p.endpoint, "--admin-socket", p.sock)
	// the other benchmarks measure one address doing many exchanges: lift
	// the per-source budget and share unless serveArgs set them again
	p.cmd.Args = append(p.cmd.Args, "--unproven-per-source=-1", "--connections-per-source=-1")
	p.cmd.Args = append(p.cmd.Args, serveArgs...)
	logPath := filepath.Join(b.TempDir(), "listener.log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		b.Fatal(err)
	}
	p.cmd.Stderr = logFile
	b.Cleanup(func() {
		logFile.Close()
		if b.Failed() {
			b.Logf("the listener's last log lines:\n%s", tailLines(logPath, 30))
		} else if n, first := warnings(logPath, 5); n > 0 {
			b.Logf("the listener warned %d times; the first:\n%s", n, strings.Join(first, "\n"))
		}
	})
	// a bench killed by a timeout must not leave its listener behind
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(p.stop)
	for range 100 {
		if _, err := os.Stat(p.sock); err == nil {
			return p
		}
		time.Sleep(50 * time.Millisecond)
	}
	b.Fatal("listener did not start")
	return nil
}

// memoryDir makes a directory on tmpfs (/dev/shm), removed when the
// benchmark ends: an fdatasync of a file there has no disk to flush.
func memoryDir(b *testing.B) (string, error) {
	dir, err := os.MkdirTemp("/dev/shm", "sjb")
	if err != nil {
		return "", fmt.Errorf("a directory in memory: %w", err)
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		return "", fmt.Errorf("statfs %s: %w", dir, err)
	}
	if fs.Type != unix.TMPFS_MAGIC {
		return "", fmt.Errorf("%s is not on tmpfs (filesystem type %#x)", dir, fs.Type)
	}
	return dir, nil
}

// tailLines is the last n lines of the file at path.
func tailLines(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// warnings counts the lines of a listener's JSON log at level WARN or
// ERROR, and returns the first max of them: a bench's figures hold only
// for a listener that did what it was asked without complaint.
func warnings(path string, max int) (n int, first []string) {
	data, _ := os.ReadFile(path)
	for line := range strings.SplitSeq(string(data), "\n") {
		if strings.Contains(line, `"level":"WARN"`) || strings.Contains(line, `"level":"ERROR"`) {
			if n++; n <= max {
				first = append(first, line)
			}
		}
	}
	return n, first
}

// stop ends the listener; a second call does nothing.
func (p *proc) stop() {
	p.once.Do(func() { p.cmd.Process.Signal(syscall.SIGTERM); p.cmd.Wait() })
}

func (p *proc) mint(b *testing.B, args ...string) string {
	b.Helper()
	cmd := exec.Command(filepath.Join(binDir, "stratum-listener"), append([]string{"codes", "create", "--json", "--auto-approve"}, args...)...)
	cmd.Env = append(os.Environ(), "STRATUM_ADMIN_SOCKET="+p.sock)
	out, err := cmd.Output()
	if err != nil {
		b.Fatalf("mint: %v", err)
	}
	var c struct{ Code, ID string }
	if err := json.Unmarshal(out, &c); err != nil {
		b.Fatal(err)
	}
	return c.Code + " " + c.ID
}

func (p *proc) admin(b *testing.B, args ...string) {
	cmd := exec.Command(filepath.Join(binDir, "stratum-listener"), args...)
	cmd.Env = append(os.Environ(), "STRATUM_ADMIN_SOCKET="+p.sock)
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("%v: %v %s", args, err, out)
	}
}

// cpu returns the CPU time a process has used, its threads' and those
// that have ended, to the nanosecond: the kernel's CPU clock of the
// process (clock_gettime of the clock id clock_getcpuclockid(3) makes).
// The 10 ms ticks of /proc/PID/stat are a block of joins' error bar at
// these block sizes; they are the fallback where the clock is refused.
func cpu(pid int) time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(processCPUClock(pid), &ts); err == nil {
		return time.Duration(ts.Nano())
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / 100 // USER_HZ
}

// spin is the child of TestCPUIsTheProcessCPUClock: two threads busy
// for 300 ms of CPU each, which then end, and it waits for stdin to
// close.
func spin() {
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			runtime.LockOSThread() // the thread ends with the goroutine
			var ts unix.Timespec
			for {
				if unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts) != nil || ts.Nano() >= 300e6 {
					return
				}
			}
		})
	}
	wg.Wait()
	fmt.Println("spun")
	io.Copy(io.Discard, os.Stdin)
}

// processCPUClock is the clock id of pid's CPU time as the kernel encodes
// it (include/linux/posix-timers.h: the pid inverted, shifted past the
// three clock bits, CPUCLOCK_SCHED), as glibc's clock_getcpuclockid does.
func processCPUClock(pid int) int32 {
	const cpuclockSched = 2
	return int32(^pid<<3 | cpuclockSched)
}

// rss returns VmRSS and VmHWM in KiB.
func rss(pid int) (cur, peak int) {
	st, _ := procmem.ReadStatus(pid)
	return st.RSS, st.HWM
}
