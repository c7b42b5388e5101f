package bench

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"math"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/stratumjoin/stratum/internal/joincode"
	"github.com/stratumjoin/stratum/internal/pake"
	"github.com/stratumjoin/stratum/internal/wire"
)

// challengeTime measures Hello -> Challenge for one exchange; with prove
// it then completes the join (so a live code never accumulates unproven
// attempts).
func challengeTime(ctx context.Context, endpoint string, sec joincode.Secret, prove bool) (time.Duration, int, error) {
	conn, err := quic.DialAddr(ctx, endpoint, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{wire.ALPNJoin}}, nil)
	if err != nil {
		return 0, 0, err
	}
	defer conn.CloseWithError(0, "")
	cs := conn.ConnectionState()
	exp, _ := cs.TLS.ExportKeyingMaterial("EXPORTER-Channel-Binding", nil, 32)
	str, err := conn.OpenStreamSync(ctx)
	if err != nil {
		return 0, 0, err
	}
	login, ke1, err := pake.Start(pake.BindingContext(exp), sec.Locator, sec.Password())
	if err != nil {
		return 0, 0, err
	}
	t0 := time.Now()
	if err := wire.Write(str, &wire.Hello{Version: wire.Version, Locator: sec.Locator, KE1: ke1}); err != nil {
		return 0, 0, err
	}
	typ, body, err := wire.ReadFrame(str)
	d := time.Since(t0)
	if err != nil {
		return 0, 0, err
	}
	var ch wire.Challenge
	if err := wire.Decode(typ, body, &ch); err != nil {
		return 0, 0, err
	}
	if prove {
		fp := sha256.Sum256(ch.CAChain[len(ch.CAChain)-1])
		ke3, _, err := login.Finish(ch.KE2, fp[:], ch.KSF)
		if err != nil {
			return 0, 0, err
		}
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		csr, _ := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
		if err := wire.Write(str, &wire.Proof{KE3: ke3, CSR: csr}); err != nil {
			return 0, 0, err
		}
		var res wire.Result
		if err := wire.Read(str, &res); err != nil {
			return 0, 0, err
		}
	}
	return d, 5 + len(body), nil
}

// ks is the two-sample Kolmogorov-Smirnov statistic.
func ks(a, b []time.Duration) float64 {
	a = append([]time.Duration(nil), a...)
	b = append([]time.Duration(nil), b...)
	sort.Slice(a, func(i, j int) bool { return a[i] < a[j] })
	sort.Slice(b, func(i, j int) bool { return b[i] < b[j] })
	var i, j int
	var d float64
	for i < len(a) && j < len(b) {
		if a[i] <= b[j] {
			i++
		} else {
			j++
		}
		d = math.Max(d, math.Abs(float64(i)/float64(len(a))-float64(j)/float64(len(b))))
	}
	return d
}

// BenchmarkChallengeTiming compares the Challenge of a live code (counted
// with a durable write), an inactive one (revoked) and an unknown
// selector: sizes and Hello->Challenge timing distributions.
func BenchmarkChallengeTiming(b *testing.B) {
	const n = 300
	p := startListener(b, true)
	liveF := strings.Fields(p.mint(b, "--max-uses", "0"))
	revF := strings.Fields(p.mint(b))
	p.admin(b, "codes", "revoke", revF[1])
	live, _ := joincode.Parse(liveF[0])
	revoked, _ := joincode.Parse(revF[0])
	used := map[string]bool{live.Locator: true, revoked.Locator: true}
	var unknown joincode.Secret
	for i := 0; unknown.Locator == "" || used[unknown.Locator]; i++ {
		unknown, _ = joincode.NewCode(joincode.SelectorAt(i))
	}
	ctx := context.Background()
	samples := map[string][]time.Duration{}
	sizes := map[string]map[int]bool{}
	// interleave the three kinds so drift in the machine hits all alike
	for range n {
		for _, k := range []struct {
			name  string
			sec   joincode.Secret
			prove bool
		}{{"live", live, true}, {"inactive", revoked, false}, {"unknown", unknown, false}} {
			d, size, err := challengeTime(ctx, p.endpoint, k.sec, k.prove)
			if err != nil {
				b.Fatalf("%s: %v", k.name, err)
			}
			samples[k.name] = append(samples[k.name], d)
			if sizes[k.name] == nil {
				sizes[k.name] = map[int]bool{}
			}
			sizes[k.name][size] = true
		}
	}
	for _, k := range []string{"live", "inactive", "unknown"} {
		s := samples[k]
		b.Logf("%-8s Challenge sizes %v; Hello->Challenge p10 %s p50 %s p90 %s p99 %s", k, keys(sizes[k]), ms(percentile(s, .1)), ms(percentile(s, .5)), ms(percentile(s, .9)), ms(percentile(s, .99)))
	}
	b.Logf("KS distance live/unknown %.3f, live/inactive %.3f, inactive/unknown %.3f (n=%d each; 5%% critical value %.3f)",
		ks(samples["live"], samples["unknown"]), ks(samples["live"], samples["inactive"]), ks(samples["inactive"], samples["unknown"]), n, 1.36*math.Sqrt(2.0/n))
}

func keys(m map[int]bool) string {
	var s []string
	for k := range m {
		s = append(s, fmt.Sprint(k))
	}
	sort.Strings(s)
	return strings.Join(s, ",")
}
