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
	"slices"
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
// samples per kind (default 1,500).
//
// The bench tests 19 pairs, so it holds them together to 5 % (Bonferroni:
// each pair at 5 %/19). Kinds that cannot be told apart would fail half
// the runs of a bench holding each pair to 5 %, and one run in eight of
// one holding each family (code, token, key) to 5 %, as this bench did
// at 1,000 samples a kind (TestChallengeTimingVerdict). At 1,500 samples
// a kind its critical distance, 0.066, is below the 0.069 to 0.077 a
// family had then, so a difference that could fail the bench before
// still does.
func BenchmarkChallengeTiming(b *testing.B) {
	n := 1500
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

	families := make([]string, len(kinds))
	for k := range kinds {
		families[k] = kinds[k].family
	}
	if !slices.Equal(families, timingFamilies) {
		b.Fatalf("the kinds' families are %v, TestChallengeTimingVerdict simulates %v: keep them the same", families, timingFamilies)
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
		allSizes := map[int]bool{}
		for k := range kinds {
			if kinds[k].family != fam {
				continue
			}
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
	}
	tests := ksPairs(families, samples)
	for _, t := range tests {
		a, c := kinds[t.a], kinds[t.b]
		verdict := "not separable"
		switch {
		case t.separable():
			verdict = "SEPARABLE"
			b.Errorf("%s: %s and %s Challenge timings are separable: KS distance %.3f > %.3f (5 %% over the %d pairs)", a.family, a.name, c.name, t.d, t.bench, len(tests))
		case t.d > t.single:
			verdict = "above the single-pair 5 % value, within the bench's"
		}
		b.Logf("KS %-5s %-8s / %-8s %.3f (5%% critical %.3f; over the %d pairs %.3f; n=%d+%d): %s", a.family, a.name, c.name, t.d, t.single, len(tests), t.bench, len(samples[t.a]), len(samples[t.b]), verdict)
	}
}

// ksPair is the Kolmogorov-Smirnov test of two kinds of one family:
// their distance, the critical value for the pair alone at 5 %, and the
// one that holds all the bench's pairs together to 5 % (Bonferroni).
type ksPair struct {
	a, b          int
	d             float64
	single, bench float64
}

func (p ksPair) separable() bool { return p.d > p.bench }

// ksPairs tests every pair of kinds of the same family; families[k] is
// kind k's family and samples[k] its timings.
func ksPairs(families []string, samples [][]time.Duration) []ksPair {
	var tests []ksPair
	for i := range families {
		for j := i + 1; j < len(families); j++ {
			if families[i] == families[j] {
				tests = append(tests, ksPair{a: i, b: j, d: ks(samples[i], samples[j])})
			}
		}
	}
	for t := range tests {
		n, m := len(samples[tests[t].a]), len(samples[tests[t].b])
		tests[t].single = ksCritical(n, m, 0.05)
		tests[t].bench = ksCritical(n, m, 0.05/float64(len(tests)))
	}
	return tests
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

// timingFamilies is the bench's layout: five code kinds, four token
// kinds, three join key kinds.
var timingFamilies = []string{"code", "code", "code", "code", "code", "token", "token", "token", "token", "key", "key", "key"}

// simulatedFailures runs the verdict on runs simulated runs of n samples
// a kind, every kind drawn from one distribution (a floor and an
// exponential tail, as Hello->Challenge times look) and kind shifted by
// shift. It returns the share of runs the bench fails, and the shares in
// which some pair is over its family's 5 % value (each family of pairs
// held to 5 %) and over its own 5 % value.
func simulatedFailures(rng *mrand.Rand, runs, n, shifted int, shift time.Duration) (bench, family, single float64) {
	var failed, famOver, over int
	pairsOf := map[string]int{}
	for i, f := range timingFamilies {
		for _, g := range timingFamilies[i+1:] {
			if f == g {
				pairsOf[f]++
			}
		}
	}
	samples := make([][]time.Duration, len(timingFamilies))
	for range runs {
		for k := range samples {
			samples[k] = samples[k][:0]
			for range n {
				d := 600*time.Microsecond + time.Duration(rng.ExpFloat64()*float64(200*time.Microsecond))
				if k == shifted {
					d += shift
				}
				samples[k] = append(samples[k], d)
			}
		}
		var f, fo, o bool
		for _, t := range ksPairs(timingFamilies, samples) {
			f = f || t.separable()
			fo = fo || t.d > ksCritical(n, n, 0.05/float64(pairsOf[timingFamilies[t.a]]))
			o = o || t.d > t.single
		}
		if f {
			failed++
		}
		if fo {
			famOver++
		}
		if o {
			over++
		}
	}
	return float64(failed) / float64(runs), float64(famOver) / float64(runs), float64(over) / float64(runs)
}

// TestChallengeTimingVerdict checks the bench's verdict against simulated
// runs: with every kind alike it fails about 5 % of them (where a verdict
// of each pair at 5 % would fail about half), and it catches a path 20 us
// slower than the others, a tenth of the spread.
func TestChallengeTimingVerdict(t *testing.T) {
	rng := mrand.New(mrand.NewPCG(1, 2))
	const runs, n = 300, 1500
	bench, family, single := simulatedFailures(rng, runs, n, -1, 0)
	t.Logf("all kinds alike, %d runs of %d a kind: the bench fails %.1f %%; holding each family of pairs to 5 %% would fail %.1f %%, each pair %.1f %%", runs, n, 100*bench, 100*family, 100*single)
	if bench > 0.08 {
		t.Errorf("the bench fails %.1f %% of runs of kinds alike, want about 5 %%", 100*bench)
	}
	if single < 0.3 {
		t.Errorf("pairs held to 5 %% each fail %.1f %% of runs of kinds alike, want about half: the simulation does not look like the bench", 100*single)
	}
	caught, _, _ := simulatedFailures(rng, 100, n, 11, 20*time.Microsecond)
	t.Logf("one kind 20 us slower: the bench fails %.0f %% of runs", 100*caught)
	if caught < 0.95 {
		t.Errorf("the bench catches a path 20 us slower in %.0f %% of runs, want at least 95 %%", 100*caught)
	}
}
