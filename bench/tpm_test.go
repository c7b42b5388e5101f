package bench

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stratumjoin/stratum/agent"
	"github.com/stratumjoin/stratum/internal/joincode"
	"github.com/stratumjoin/stratum/internal/tpm"
	"github.com/stratumjoin/stratum/internal/tpm/swtpmtest"
	"github.com/stratumjoin/stratum/pki"
)

// BenchmarkTPMAttestation logs what TPM attestation adds to a join: the
// latency of joins with a file key and with a key in swtpm (attested, EK
// certificate checked against --tpm-ca-dir), and the listener's CPU per
// join of each, in rounds that alternate the two so that load on the
// machine falls on both alike; then the verifier's own cost in-process.
func BenchmarkTPMAttestation(b *testing.B) {
	const rounds, n = 5, 40
	sim := swtpmtest.Start(b)
	maker := swtpmtest.NewCA(b, "Bench TPM Maker")
	sim.Provision(maker)
	caDir := b.TempDir()
	if err := os.WriteFile(filepath.Join(caDir, "maker.pem"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: maker.Cert.Raw}), 0o644); err != nil {
		b.Fatal(err)
	}
	p := startListener(b, true, "--retry-above", "100000", "--tpm-ca-dir", caDir)
	// one swtpm is one machine: every TPM join after the first reclaims it
	code := p.mint(b, "--max-uses", "0", "--ttl", "1h", "--allow-reclaim")
	sec, err := joincode.Parse(strings.Fields(code)[0])
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	// batch runs n joins, the keys made before the clock starts, as on a
	// node; it returns the latencies and the listener's CPU per join
	batch := func(round int, withTPM bool) ([]time.Duration, time.Duration) {
		var lat []time.Duration
		cpu0 := cpu(p.cmd.Process.Pid)
		for i := range n {
			state := filepath.Join(dir, fmt.Sprintf("%d-%v-%d", round, withTPM, i))
			loc := ""
			if withTPM {
				loc = sim.Locator()
				writeTPMKey(b, sim, state)
			} else if _, err := (agent.State{Dir: state}).Key(); err != nil {
				b.Fatal(err)
			}
			t0 := time.Now()
			if _, err := agent.Join(context.Background(), agent.JoinConfig{StateDir: state, Endpoint: p.endpoint, Secret: sec, TPM: loc}); err != nil {
				b.Fatalf("join (tpm %v): %v", withTPM, err)
			}
			lat = append(lat, time.Since(t0))
		}
		return lat, (cpu(p.cmd.Process.Pid) - cpu0) / n
	}
	var addP50, addCPU []time.Duration
	for r := range rounds {
		order := []bool{false, true}
		if r%2 == 1 {
			order = []bool{true, false}
		}
		res := map[bool][2]time.Duration{}
		var all = map[bool][]time.Duration{}
		for _, withTPM := range order {
			lat, c := batch(r, withTPM)
			res[withTPM] = [2]time.Duration{percentile(lat, .5), c}
			all[withTPM] = lat
		}
		addP50 = append(addP50, res[true][0]-res[false][0])
		addCPU = append(addCPU, res[true][1]-res[false][1])
		b.Logf("round %d, %d joins each: file key p50 %s p99 %s, CPU %s/join; TPM key p50 %s p99 %s, CPU %s/join",
			r+1, n, ms(res[false][0]), ms(percentile(all[false], .99)), ms(res[false][1]), ms(res[true][0]), ms(percentile(all[true], .99)), ms(res[true][1]))
	}
	b.Logf("attestation adds p50 latency: median %s (min %s, max %s over %d rounds); listener CPU per join: median %s (min %s, max %s)",
		ms(median(addP50)), ms(minOf(addP50)), ms(maxOf(addP50)), rounds, ms(median(addCPU)), ms(minOf(addCPU)), ms(maxOf(addCPU)))

	// the verifier alone: claim check, EK chain, credential, answer check
	tp := sim.Open()
	defer tp.Close()
	blobs, err := tp.CreateKey()
	if err != nil {
		b.Fatal(err)
	}
	key, err := tp.LoadKey(blobs)
	if err != nil {
		b.Fatal(err)
	}
	v := tpm.NewVerifier([]*x509.Certificate{maker.Cert})
	var chal, check []time.Duration
	for range 100 {
		att, err := tp.Attest(blobs)
		if err != nil {
			b.Fatal(err)
		}
		t0 := time.Now()
		pend, ch, err := v.Challenge(att.Claim, key.Public())
		t1 := time.Now()
		if err != nil {
			b.Fatal(err)
		}
		ans, err := att.Answer(ch)
		att.Close()
		if err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		if _, err := pend.Check(ans); err != nil {
			b.Fatal(err)
		}
		check = append(check, time.Since(t2))
		chal = append(chal, t1.Sub(t0))
	}
	b.Logf("verifier in-process, 100 attestations: challenge (claim, EK chain, MakeCredential) p50 %s p99 %s; answer check p50 %s p99 %s",
		ms(percentile(chal, .5)), ms(percentile(chal, .99)), ms(percentile(check, .5)), ms(percentile(check, .99)))
}

// writeTPMKey makes a node key in the TPM and stores its blobs in state,
// as the agent's first join does.
func writeTPMKey(b *testing.B, sim *swtpmtest.Sim, state string) {
	tp := sim.Open()
	defer tp.Close()
	blobs, err := tp.CreateKey()
	if err != nil {
		b.Fatal(err)
	}
	if err := os.MkdirAll(state, 0o700); err != nil {
		b.Fatal(err)
	}
	if err := pki.WriteFiles(state, []pki.File{{Name: agent.TPMPublicFile, Data: blobs.Public, Mode: 0o600}, {Name: agent.TPMPrivateFile, Data: blobs.Private, Mode: 0o600}}); err != nil {
		b.Fatal(err)
	}
}

func median(d []time.Duration) time.Duration { return percentile(d, .5) }

func minOf(d []time.Duration) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[0]
}

func maxOf(d []time.Duration) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)-1]
}
