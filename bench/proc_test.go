package bench

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stratumjoin/stratum/internal/procmem"
	"github.com/stratumjoin/stratum/internal/testbin"
)

var binDir string

func TestMain(m *testing.M) {
	if os.Getenv("STRATUM_BENCH_FLOOR") != "" {
		os.Exit(runFloorServer())
	}
	flag.Parse()
	if f := flag.Lookup("test.bench"); f == nil || f.Value.String() == "" {
		os.Exit(m.Run()) // no benchmark selected: nothing to build
	}
	os.Exit(testbin.Run(m, &binDir, "./cmd/stratum-listener", "./cmd/stratum-agent", "./bench/floorclient"))
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
	sockDir, _ := os.MkdirTemp("/tmp", "sjb")
	b.Cleanup(func() { os.RemoveAll(sockDir) })
	p := &proc{data: filepath.Join(b.TempDir(), "l"), sock: filepath.Join(sockDir, "admin.sock"), endpoint: freeUDP(b)}
	args := append([]string{"init", "--data", p.data, "--endpoint", p.endpoint}, initArgs...)
	if out, err := exec.Command(filepath.Join(binDir, "stratum-listener"), args...).CombinedOutput(); err != nil {
		b.Fatalf("init: %v %s", err, out)
	}
	p.cmd = exec.Command(filepath.Join(binDir, "stratum-listener"), "serve", "--data", p.data, "--listen", p.endpoint, "--admin-socket", p.sock, "--log-level", "warn")
	// the other benchmarks measure one address doing many exchanges: lift
	// the per-source budget and share unless serveArgs set them again
	p.cmd.Args = append(p.cmd.Args, "--unproven-per-source=-1", "--connections-per-source=-1")
	p.cmd.Args = append(p.cmd.Args, serveArgs...)
	p.cmd.Stderr = os.Stderr
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

// cpu returns the user+system CPU time a process has used.
func cpu(pid int) time.Duration {
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

// rss returns VmRSS and VmHWM in KiB.
func rss(pid int) (cur, peak int) {
	st, _ := procmem.ReadStatus(pid)
	return st.RSS, st.HWM
}
