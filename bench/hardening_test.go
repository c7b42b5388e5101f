package bench

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/stratumjoin/stratum/agent"
	"github.com/stratumjoin/stratum/internal/forgedquic"
	"github.com/stratumjoin/stratum/internal/joincode"
	"github.com/stratumjoin/stratum/internal/pake"
	"github.com/stratumjoin/stratum/internal/testenv"
	"github.com/stratumjoin/stratum/internal/wire"
	"github.com/stratumjoin/stratum/listener/adminclient"
)

// honestSource is a loopback address in another /24 than the attacker's
// 127.0.0.1.
const honestSource = "127.0.1.2"

func dialFrom(tb testing.TB, ip string) func(ctx context.Context, ep string, tc *tls.Config, qc *quic.Config) (*quic.Conn, error) {
	tb.Helper()
	pc, err := net.ListenPacket("udp", ip+":0")
	if err != nil {
		tb.Fatal(err)
	}
	tr := &quic.Transport{Conn: pc}
	tb.Cleanup(func() { tr.Close(); pc.Close() })
	return func(ctx context.Context, ep string, tc *tls.Config, qc *quic.Config) (*quic.Conn, error) {
		addr, err := net.ResolveUDPAddr("udp", ep)
		if err != nil {
			return nil, err
		}
		return tr.Dial(ctx, addr, tc, qc)
	}
}

// sweepStart sends one Hello for sec's locator and reads the answer:
// true for a Challenge, false for a refusal before any KE2.
func sweepStart(ctx context.Context, endpoint string, sec joincode.Secret) (bool, error) {
	conn, err := quic.DialAddr(ctx, endpoint, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{wire.ALPNJoin}}, nil)
	if err != nil {
		return false, err
	}
	defer conn.CloseWithError(0, "")
	cs := conn.ConnectionState()
	exp, _ := wire.Exporter(cs.TLS)
	str, err := conn.OpenStreamSync(ctx)
	if err != nil {
		return false, err
	}
	_, ke1, err := pake.Start(wire.BindingContext(exp), sec.Locator, sec.Password())
	if err != nil {
		return false, err
	}
	if err := wire.Write(str, &wire.Hello{Version: wire.Version, Locator: sec.Locator, KE1: ke1}); err != nil {
		return false, err
	}
	typ, _, err := wire.ReadFrame(str)
	if err != nil {
		return false, err
	}
	return typ == wire.TypeChallenge, nil
}

// BenchmarkSelectorSweep: one address sends 11 Hellos with wrong codes to
// each of 64 live codes' selectors, 48 at once, against a listener
// process; with the per-source budget lifted (before) and with the
// default budget (after). It reports the codes burned and counted, and
// whether an honest holder from another address then joins.
func BenchmarkSelectorSweep(b *testing.B) {
	for _, tc := range []struct {
		name  string
		serve []string
	}{
		{"budget-lifted", nil},
		{"default-budget", []string{"--unproven-per-source=8", "--connections-per-source=64", "--budget-wait=100ms"}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			for range b.N {
				p := startListener(b, true, tc.serve...)
				cli := adminclient.New(p.sock)
				var secs []joincode.Secret
				var ids []string
				for range 64 {
					f := strings.Fields(p.mint(b, "--ttl", "1h"))
					sec, err := joincode.Parse(f[0])
					if err != nil {
						b.Fatal(err)
					}
					secs, ids = append(secs, sec), append(ids, f[1])
				}
				jobs := make(chan joincode.Secret)
				var challenges, refused, failed atomic.Int32
				var wg sync.WaitGroup
				start := time.Now()
				for range 48 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for sec := range jobs {
							ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
							ch, err := sweepStart(ctx, p.endpoint, sec)
							cancel()
							switch {
							case err != nil:
								failed.Add(1)
							case ch:
								challenges.Add(1)
							default:
								refused.Add(1)
							}
						}
					}()
				}
				for _, sec := range secs {
					for range 11 {
						w, _ := joincode.NewCode(sec.Locator)
						jobs <- w
					}
				}
				close(jobs)
				wg.Wait()
				took := time.Since(start)
				burned, counted := 0, 0
				for _, id := range ids {
					c, err := cli.Code(context.Background(), id)
					if err != nil {
						b.Fatal(err)
					}
					if c.State == "revoked" {
						burned++
					}
					if c.FailedAttempts > 0 {
						counted++
					}
				}
				jstart := time.Now()
				_, jerr := agent.Join(context.Background(), agent.JoinConfig{StateDir: filepath.Join(b.TempDir(), "s"), Endpoint: p.endpoint, Secret: secs[0], Dial: dialFrom(b, honestSource)})
				honest := "joined in " + time.Since(jstart).Round(time.Millisecond).String()
				var r *agent.RefusedError
				if errors.As(jerr, &r) {
					honest = "refused " + r.Code
				} else if jerr != nil {
					honest = "failed: " + jerr.Error()
				}
				b.Logf("%s: 704 starts in %s: %d Challenges, %d refused before KE2, %d failed; %d of 64 codes burned, %d with a counted attempt; honest holder from %s: %s",
					tc.name, took.Round(time.Millisecond), challenges.Load(), refused.Load(), failed.Load(), burned, counted, honestSource, honest)
				b.ReportMetric(float64(burned), "burned-codes")
				b.ReportMetric(float64(counted), "counted-codes")
			}
		})
	}
}

// BenchmarkStallRSS: 2,100 connections from one address complete the
// handshake and open no stream, against a listener process. It reports
// the listener's peak RSS, how many connections it held, how long until
// the last was closed, and an honest join from another address during
// the stall; with the per-source share (default) and without it.
func BenchmarkStallRSS(b *testing.B) {
	for _, tc := range []struct {
		name  string
		serve []string
	}{
		{"per-source-share", []string{"--connections-per-source=64", "--retry-above=1000000"}},
		{"no-share", []string{"--retry-above=1000000"}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			for range b.N {
				p := startListener(b, true, tc.serve...)
				f := strings.Fields(p.mint(b, "--ttl", "1h"))
				sec, err := joincode.Parse(f[0])
				if err != nil {
					b.Fatal(err)
				}
				time.Sleep(500 * time.Millisecond) // let start-up allocations settle
				rss0, _ := rss(p.cmd.Process.Pid)
				pc, err := net.ListenPacket("udp", "127.0.0.1:0")
				if err != nil {
					b.Fatal(err)
				}
				tr := &quic.Transport{Conn: pc}
				udp, _ := net.ResolveUDPAddr("udp", p.endpoint)
				var mu sync.Mutex
				var held []*quic.Conn
				var wg sync.WaitGroup
				sem := make(chan struct{}, 64)
				start := time.Now()
				var honest string
				honestDone := make(chan struct{})
				go func() {
					defer close(honestDone)
					time.Sleep(time.Second) // into the attack
					t0 := time.Now()
					_, err := agent.Join(context.Background(), agent.JoinConfig{StateDir: filepath.Join(b.TempDir(), "s"), Endpoint: p.endpoint, Secret: sec, Dial: dialFrom(b, honestSource)})
					honest = "joined in " + time.Since(t0).Round(time.Millisecond).String()
					if err != nil {
						honest = "failed: " + err.Error()
					}
				}()
				for range 2100 {
					wg.Add(1)
					sem <- struct{}{}
					go func() {
						defer wg.Done()
						defer func() { <-sem }()
						ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
						defer cancel()
						c, err := tr.Dial(ctx, udp, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{wire.ALPNJoin}},
							&quic.Config{HandshakeIdleTimeout: 10 * time.Second, MaxIdleTimeout: 10 * time.Minute})
						if err == nil {
							mu.Lock()
							held = append(held, c)
							mu.Unlock()
						}
					}()
				}
				wg.Wait()
				attack := time.Since(start)
				<-honestDone
				var lastClose time.Time
				stalled := 0
				for _, c := range held {
					select {
					case <-c.Context().Done():
					case <-time.After(2 * time.Minute):
					}
					lastClose = time.Now()
					var ae *quic.ApplicationError
					if errors.As(context.Cause(c.Context()), &ae) && ae.ErrorMessage == "no stream" {
						stalled++ // held until the first-stream deadline, not turned away at once
					}
				}
				_, peak := rss(p.cmd.Process.Pid)
				tr.Close()
				pc.Close()
				b.Logf("%s: 2,100 stalled dials over %s: %d completed the handshake, %d of them held until the first-stream deadline; last closed %s after the attack began; listener RSS %d KiB at start, peak %d KiB (%.1f MiB); honest join from %s: %s",
					tc.name, attack.Round(100*time.Millisecond), len(held), stalled, lastClose.Sub(start).Round(100*time.Millisecond), rss0, peak, float64(peak)/1024, honestSource, honest)
				b.ReportMetric(float64(peak)/1024, "peak-MiB")
				b.ReportMetric(float64(stalled), "held-conns")
			}
		})
	}
}

// BenchmarkForgedSources: a flood of forged Initials, each the first
// flight of a connection from an address of its own that never answers,
// against a listener process with its default bounds, while honest agents
// join, one a second into the flood and one eight seconds in. The first
// forged handshakes hold every handshake place until they time out (5 s),
// and the Initials after them wait in the backlog; the failures turn on
// the address checks, so from then on each forged connection is asked for
// a Retry, never answered, and gives its place up at once. It logs how
// long the honest joins took, what the listener counted, its CPU per
// forged Initial and its peak RSS, over three runs.
func BenchmarkForgedSources(b *testing.B) {
	const flood, runs = 12 * time.Second, 3
	// the forged sockets are not *net.UDPConn, whose buffers quic-go sizes
	b.Setenv("QUIC_GO_DISABLE_RECEIVE_BUFFER_WARNING", "true")
	var early, late, perForged []time.Duration
	for run := range runs {
		metrics := testenv.FreeTCP(b)
		p := startListener(b, true, "--metrics", metrics)
		tokens := p.mintTokens(b, 2)
		cpu0 := cpu(p.cmd.Process.Pid)
		start := time.Now()
		type outcome struct {
			took time.Duration
			err  error
		}
		honest := make(chan outcome, 2)
		go func() {
			for i, at := range []time.Duration{time.Second, 8 * time.Second} {
				time.Sleep(time.Until(start.Add(at)))
				sec, err := joincode.Parse(tokens[i])
				if err != nil {
					honest <- outcome{err: err}
					continue
				}
				t0 := time.Now()
				_, err = agent.Join(context.Background(), agent.JoinConfig{StateDir: filepath.Join(b.TempDir(), "s"), Endpoint: p.endpoint, Secret: sec, Dial: dialFrom(b, honestSource)})
				honest <- outcome{time.Since(t0), err}
			}
		}()
		forged := 0
		for time.Since(start) < flood {
			// each from an address of its own, as a flood of forged
			// addresses looks: 127.2.0.1 on
			stop, err := forgedquic.Send(p.endpoint, fmt.Sprintf("127.2.%d.%d:0", forged/250, forged%250+1), wire.ALPNJoin)
			if err != nil {
				b.Fatal(err)
			}
			stop()
			forged++
		}
		var took [2]time.Duration
		for i := range took {
			o := <-honest
			if o.err != nil {
				b.Fatalf("run %d: honest join %d during the flood: %v", run+1, i+1, o.err)
			}
			took[i] = o.took
		}
		early, late = append(early, took[0]), append(late, took[1])
		// the flood is over once no forged connection holds a place
		for goMetric(b, metrics, "stratum_listener_backlog_connections") > 0 || goMetric(b, metrics, "stratum_listener_handshakes") > 0 {
			time.Sleep(100 * time.Millisecond) // polling for the last forged handshake to time out
		}
		used := cpu(p.cmd.Process.Pid) - cpu0
		perForged = append(perForged, used/time.Duration(forged))
		_, peak := rss(p.cmd.Process.Pid)
		b.Logf("run %d: %d forged Initials over %s; honest joins from %s took %s (1 s in) and %s (8 s in); listener: %.0f failed handshakes, %.0f Retries, address checks %.0f, CPU %s in all, %s per forged Initial, peak RSS %.1f MiB",
			run+1, forged, flood, honestSource, secs(took[0]), secs(took[1]),
			goMetric(b, metrics, "stratum_listener_handshake_failures_total"), goMetric(b, metrics, "stratum_listener_quic_retries_total"), goMetric(b, metrics, "stratum_listener_address_checks"),
			used.Round(time.Millisecond), perForged[len(perForged)-1].Round(time.Microsecond), float64(peak)/1024)
		p.stop()
	}
	us := func(d time.Duration) string { return d.Round(time.Microsecond).String() }
	b.Logf("over %d runs, min / median / max: honest join 1 s in %s, 8 s in %s; listener CPU per forged Initial %s", runs, minMedMax(early, secs), minMedMax(late, secs), minMedMax(perForged, us))
}

// minMedMax is "min / median / max" of ds, each as format writes it.
func minMedMax(ds []time.Duration, format func(time.Duration) string) string {
	ds = slices.Sorted(slices.Values(ds))
	return format(ds[0]) + " / " + format(ds[len(ds)/2]) + " / " + format(ds[len(ds)-1])
}
