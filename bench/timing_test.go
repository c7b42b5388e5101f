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
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strconv"
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
	exp, _ := wire.Exporter(cs.TLS)
	str, err := conn.OpenStreamSync(ctx)
	if err != nil {
		return 0, 0, err
	}
	login, ke1, err := pake.Start(wire.BindingContext(exp), sec.Locator, sec.Password())
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

// timingKind is one class of Hello whose Challenge must not be told apart
// from the others: a live code (counted, then proven so it never nears
// the burn), inactive codes of each reason (uncounted, real record) and an
// unknown selector (fake record).
type timingKind struct {
	family string // the locator's shape: a guesser knows which it sent
	name   string
	sec    joincode.Secret
	prove  bool
}

// BenchmarkChallengeTiming tests the claim that nothing before KE3 tells
// a guesser which kind of record it met, for each shape of locator (join
// codes, joinTokens tokens, join keys): the Challenge sizes must be equal
// and no pair of Hello->Challenge timing distributions may be separable by
// a two-sample Kolmogorov-Smirnov test at 5 %. The kinds are drawn in a
// random order, so neither machine drift nor the work a completed join
// leaves behind falls on one kind more than another. The bench fails (not
// the test suite) when a pair is separable; STRATUM_TIMING_N sets the
// samples per kind (default 1,000).
func BenchmarkChallengeTiming(b *testing.B) {
	n := 1000
	if v, err := strconv.Atoi(os.Getenv("STRATUM_TIMING_N")); err == nil && v > 0 {
		n = v
	}
	registry := filepath.Join(b.TempDir(), "registry.yaml")
	if err := os.WriteFile(registry, []byte(benchRegistry), 0o600); err != nil {
		b.Fatal(err)
	}
	p := startListener(b, true, "--registry", registry)
	ctx := context.Background()
	parse := func(f []string) joincode.Secret {
		sec, err := joincode.Parse(f[0])
		if err != nil {
			b.Fatal(err)
		}
		return sec
	}
	live := parse(strings.Fields(p.mint(b, "--max-uses", "0")))

	revokedF := strings.Fields(p.mint(b))
	p.admin(b, "codes", "revoke", revokedF[1])
	revoked := parse(revokedF)

	usedUp := parse(strings.Fields(p.mint(b, "--max-uses", "1")))
	if _, _, err := challengeTime(ctx, p.endpoint, usedUp, true); err != nil {
		b.Fatalf("use up a code: %v", err)
	}

	burned := parse(strings.Fields(p.mint(b)))
	wrong, err := joincode.NewCode(burned.Locator)
	if err != nil {
		b.Fatal(err)
	}
	for range 11 {
		if _, _, err := challengeTime(ctx, p.endpoint, wrong, false); err != nil {
			b.Fatalf("burn a code: %v", err)
		}
	}

	used := map[string]bool{live.Locator: true, revoked.Locator: true, usedUp.Locator: true, burned.Locator: true}
	var unknown joincode.Secret
	for i := 0; unknown.Locator == "" || used[unknown.Locator]; i++ {
		unknown, _ = joincode.NewCode(joincode.SelectorAt(i))
	}
	// Tokens are a family of their own: their starts are not counted
	// before the KE2 (nothing burns them), on every path of their shape.
	liveToken := parse([]string{p.mintToken(b, 10000, "timing-live")})
	revokedToken := parse([]string{p.mintToken(b, 1, "timing-revoked")})
	p.revokeToken(b, revokedToken.Locator)
	usedUpToken := parse([]string{p.mintToken(b, 1, "timing-used-up")})
	if _, _, err := challengeTime(ctx, p.endpoint, usedUpToken, true); err != nil {
		b.Fatalf("use up a token: %v", err)
	}
	// an unknown token id of the minted ones' length (jt_ and 52
	// symbols): a guesser probing for a token sends ids of that shape
	unknownToken, err := joincode.NewToken("jt_" + strings.Repeat("0", len(liveToken.Locator)-len("jt_")))
	if err != nil {
		b.Fatal(err)
	}
	// Join keys are a third: live, expired, and an unknown id of their
	// length (dnjoin- and 26 symbols)
	liveKey := parse([]string{p.mintJoinKey(b)})
	expiring := time.Now().Add(3 * time.Second).Truncate(time.Second).Add(time.Second)
	expiredKey := parse([]string{p.mintJoinKeyAs(b, "timing-expired", expiring)})
	time.Sleep(time.Until(expiring) + 100*time.Millisecond)
	unknownKey, err := joincode.NewKey("dnjoin-" + strings.Repeat("A", len(liveKey.Locator)-len("dnjoin-")))
	if err != nil {
		b.Fatal(err)
	}
	kinds := []timingKind{
		{"code", "live", live, true},
		{"code", "revoked", revoked, false},
		{"code", "used-up", usedUp, false},
		{"code", "burned", burned, false},
		{"code", "unknown", unknown, false},
		{"token", "live", liveToken, true},
		{"token", "revoked", revokedToken, false},
		{"token", "used-up", usedUpToken, false},
		{"token", "unknown", unknownToken, false},
		{"key", "live", liveKey, true},
		{"key", "expired", expiredKey, false},
		{"key", "unknown", unknownKey, false},
	}

	schedule := make([]int, 0, n*len(kinds))
	for k := range kinds {
		for range n {
			schedule = append(schedule, k)
		}
	}
	mrand.Shuffle(len(schedule), func(i, j int) { schedule[i], schedule[j] = schedule[j], schedule[i] })
	samples := make([][]time.Duration, len(kinds))
	sizes := make([]map[int]bool, len(kinds))
	for k := range kinds {
		sizes[k] = map[int]bool{}
	}
	for _, k := range schedule {
		d, size, err := challengeTime(ctx, p.endpoint, kinds[k].sec, kinds[k].prove)
		if err != nil {
			b.Fatalf("%s: %v", kinds[k].name, err)
		}
		samples[k] = append(samples[k], d)
		sizes[k][size] = true
	}

	for _, fam := range []string{"code", "token", "key"} {
		var members []int
		for k := range kinds {
			if kinds[k].family == fam {
				members = append(members, k)
			}
		}
		allSizes := map[int]bool{}
		for _, k := range members {
			s := samples[k]
			for size := range sizes[k] {
				allSizes[size] = true
			}
			b.Logf("%-5s %-8s n=%d Challenge sizes %v; Hello->Challenge p10 %s p50 %s p90 %s p99 %s", fam, kinds[k].name, len(s), keys(sizes[k]),
				ms(percentile(s, .1)), ms(percentile(s, .5)), ms(percentile(s, .9)), ms(percentile(s, .99)))
		}
		if len(allSizes) != 1 {
			b.Errorf("%s Challenge sizes differ between kinds: %v", fam, keys(allSizes))
		}
		// Testing every pair at 5 % would fail a fair listener one run in
		// three or so; the verdict holds each family of pairs to 5 %
		// (Bonferroni), and each pair's own 5 % value is shown beside it.
		pairs := len(members) * (len(members) - 1) / 2
		for x, i := range members {
			for _, j := range members[x+1:] {
				n, m := len(samples[i]), len(samples[j])
				d := ks(samples[i], samples[j])
				crit, family := ksCritical(n, m, 0.05), ksCritical(n, m, 0.05/float64(pairs))
				verdict := "not separable"
				switch {
				case d > family:
					verdict = "SEPARABLE"
					b.Errorf("%s: %s and %s Challenge timings are separable: KS distance %.3f > %.3f (5 %% over %d pairs)", fam, kinds[i].name, kinds[j].name, d, family, pairs)
				case d > crit:
					verdict = "above the single-pair 5 % value, within the family's"
				}
				b.Logf("KS %-5s %-8s / %-8s %.3f (5%% critical %.3f; family of %d pairs %.3f; n=%d+%d): %s", fam, kinds[i].name, kinds[j].name, d, crit, pairs, family, n, m, verdict)
			}
		}
	}
}

// ksCritical is the two-sample Kolmogorov-Smirnov critical value at
// significance alpha: c(alpha) * sqrt((n+m)/(n*m)), c = sqrt(-ln(alpha/2)/2).
func ksCritical(n, m int, alpha float64) float64 {
	return math.Sqrt(-math.Log(alpha/2)/2) * math.Sqrt(float64(n+m)/float64(n*m))
}

func keys(m map[int]bool) string {
	var s []string
	for k := range m {
		s = append(s, fmt.Sprint(k))
	}
	sort.Strings(s)
	return strings.Join(s, ",")
}
