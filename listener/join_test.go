package listener_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"errors"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stratumjoin/stratum/agent"
	"github.com/stratumjoin/stratum/internal/cluster"
	"github.com/stratumjoin/stratum/internal/joincode"
	"github.com/stratumjoin/stratum/internal/wire"
	"github.com/stratumjoin/stratum/listener"
	"github.com/stratumjoin/stratum/listener/adminapi"
	"github.com/stratumjoin/stratum/listener/listenertest"
	"github.com/stratumjoin/stratum/pki"
)

func mint(t testing.TB, l *listenertest.Listener, req adminapi.MintCodeRequest) (joincode.Secret, adminapi.Code) {
	t.Helper()
	return l.MintCode(t, req)
}

func join(t testing.TB, l *listenertest.Listener, sec joincode.Secret, facts wire.Facts) (*agent.Joined, string, error) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "state")
	j, err := agent.Join(context.Background(), agent.JoinConfig{StateDir: dir, Endpoint: l.Endpoint, Secret: sec, Facts: facts})
	return j, dir, err
}

func uses(n int) *int { return &n }

func TestJoinIssuesVerifiableCertificate(t *testing.T) {
	l := listenertest.Start(t, listenertest.Options{})
	sec, code := mint(t, l, adminapi.MintCodeRequest{AutoApprove: true, MaxUses: uses(1)})
	j, dir, err := join(t, l, sec, wire.Facts{Hostname: "gpu-01"})
	if err != nil {
		t.Fatalf("join: %v", err)
	}
	out, err := exec.Command("openssl", "verify", "-CAfile", filepath.Join(dir, agent.CAFile), filepath.Join(dir, agent.CertFile)).CombinedOutput()
	if err != nil || !strings.Contains(string(out), ": OK") {
		t.Fatalf("openssl verify: %v\n%s", err, out)
	}
	// the certificate's key is node.key's
	keyPub, err := exec.Command("openssl", "pkey", "-in", filepath.Join(dir, agent.KeyFile), "-pubout").Output()
	if err != nil {
		t.Fatal(err)
	}
	certPub, err := exec.Command("openssl", "x509", "-in", filepath.Join(dir, agent.CertFile), "-noout", "-pubkey").Output()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(keyPub, certPub) {
		t.Fatalf("certificate key differs from node.key:\n%s\n%s", keyPub, certPub)
	}
	if j.Identity.CAFingerprint != code.CAFingerprint {
		t.Fatalf("pinned %s, code minted under %s", j.Identity.CAFingerprint, code.CAFingerprint)
	}
	leaf := j.Chain[0]
	if leaf.Subject.CommonName != j.Identity.NodeID || len(leaf.URIs) != 1 || leaf.URIs[0].String() != "spiffe://stratum.local/node/"+j.Identity.NodeID {
		t.Fatalf("names: CN %q URIs %v", leaf.Subject.CommonName, leaf.URIs)
	}
	if !pki.ValidNodeID(j.Identity.NodeID) || j.Identity.Role != cluster.RoleNode || j.Identity.Trust != cluster.TrustPlatform {
		t.Fatalf("identity %+v", j.Identity)
	}
	n, err := l.Admin.Node(context.Background(), j.Identity.NodeID)
	if err != nil || n.Facts.Hostname != "gpu-01" || n.SecretID != code.ID {
		t.Fatalf("node record %+v %v", n, err)
	}
	c, _ := l.Admin.Code(context.Background(), code.ID)
	if c.Registrations != 1 || c.Uses != 1 || c.FailedAttempts != 0 || c.State != "revoked" || c.RevokedBy != cluster.UsedUpBy {
		t.Fatalf("code after join: %+v", c)
	}
}

func TestListenerDecidesCertificateNames(t *testing.T) {
	l := listenertest.Start(t, listenertest.Options{})
	sec, _ := mint(t, l, adminapi.MintCodeRequest{AutoApprove: true})
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	bc, _ := asn1.Marshal(struct {
		IsCA bool `asn1:"optional"`
	}{true})
	evil, _ := url.Parse("spiffe://stratum.local/listener")
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject:         pkix.Name{CommonName: "admin", Organization: []string{"system:masters"}},
		DNSNames:        []string{"kubernetes.default", "listener.example"},
		URIs:            []*url.URL{evil},
		ExtraExtensions: []pkix.Extension{{Id: asn1.ObjectIdentifier{2, 5, 29, 19}, Critical: true, Value: bc}},
	}, key)
	if err != nil {
		t.Fatal(err)
	}
	out, err := rawJoin{Secret: sec, CSR: csr}.run(context.Background(), l.Endpoint)
	if err != nil || out.PAKEErr != nil || len(out.Results) != 1 {
		t.Fatalf("raw join: %v %v %+v", err, out.PAKEErr, out.Results)
	}
	res := out.Results[0]
	if res.Status != wire.StatusJoined {
		t.Fatalf("result %+v", res)
	}
	cert, _ := x509.ParseCertificate(res.CertChain[0])
	if cert.Subject.CommonName != res.NodeID || len(cert.Subject.Organization) != 0 || len(cert.DNSNames) != 0 || len(cert.URIs) != 1 ||
		cert.URIs[0].String() != "spiffe://stratum.local/node/"+res.NodeID || cert.IsCA || !cert.BasicConstraintsValid {
		t.Fatalf("listener let the CSR choose names: CN=%q O=%v DNS=%v URIs=%v CA=%v", cert.Subject.CommonName, cert.Subject.Organization, cert.DNSNames, cert.URIs, cert.IsCA)
	}
	if !cert.PublicKey.(*ecdsa.PublicKey).Equal(&key.PublicKey) {
		t.Fatal("certificate for another key")
	}
}

func TestWrongCodeBurnsAfterTen(t *testing.T) {
	var real, counted, proofs atomic.Int32
	// every guess comes from one address: lift its budget of unproven starts
	l := listenertest.Start(t, listenertest.Options{Config: listener.WithHooks(listener.Config{UnprovenPerSource: -1}, listener.Hooks{
		Challenge: func(_ string, r, c bool) {
			if r && c {
				counted.Add(1)
			}
			if r {
				real.Add(1)
			}
		},
		Proof: func(string) { proofs.Add(1) },
	})})
	sec, code := mint(t, l, adminapi.MintCodeRequest{AutoApprove: true})
	bad := wrongCode(t, sec)
	for i := 1; i <= 10; i++ {
		_, _, err := join(t, l, bad, wire.Facts{})
		if !errors.Is(err, agent.ErrNotAccepted) {
			t.Fatalf("attempt %d: %v, want ErrNotAccepted", i, err)
		}
		if got := counted.Load(); got != int32(i) {
			t.Fatalf("attempt %d: %d counted real KE2s", i, got)
		}
		c, _ := l.Admin.Code(context.Background(), code.ID)
		if c.FailedAttempts != i || c.State != "live" {
			t.Fatalf("attempt %d: code %+v", i, c)
		}
	}
	if proofs.Load() != 0 {
		t.Fatalf("the agent sent %d Proofs with a wrong code", proofs.Load())
	}
	// the 11th start burns the code instead of counting
	if _, _, err := join(t, l, bad, wire.Facts{}); !errors.Is(err, agent.ErrNotAccepted) {
		t.Fatalf("11th: %v", err)
	}
	if counted.Load() != 10 {
		t.Fatalf("%d counted KE2s after the 11th start", counted.Load())
	}
	c, _ := l.Admin.Code(context.Background(), code.ID)
	if c.State != "revoked" || c.RevokedBy != cluster.BurnedBy || c.RevokedAt == nil {
		t.Fatalf("code not burned: %+v", c)
	}
	evs, _ := l.Admin.Events(context.Background(), "", 0)
	if n := countEvents(evs, cluster.EventSecretBurned); n != 1 {
		t.Fatalf("%d burn events", n)
	}
	// the right code now learns why it is refused
	_, _, err := join(t, l, sec, wire.Facts{})
	var refused *agent.RefusedError
	if !errors.As(err, &refused) || refused.Code != wire.CodeRevoked || !strings.Contains(refused.Message, "burned") {
		t.Fatalf("right code after burn: %v", err)
	}
}

func countEvents(evs []cluster.Event, typ string) int {
	n := 0
	for _, e := range evs {
		if e.Type == typ {
			n++
		}
	}
	return n
}

func TestConcurrentWrongAttemptsCountAtMostTen(t *testing.T) {
	var counted, uncounted atomic.Int32
	l := listenertest.Start(t, listenertest.Options{Config: listener.WithHooks(listener.Config{UnprovenPerSource: -1, PerSourceConnections: -1}, listener.Hooks{
		Challenge: func(_ string, r, c bool) {
			switch {
			case r && c:
				counted.Add(1)
			case r:
				uncounted.Add(1)
			}
		},
	})})
	sec, code := mint(t, l, adminapi.MintCodeRequest{AutoApprove: true})
	bad := wrongCode(t, sec)
	var wg sync.WaitGroup
	var failures atomic.Int32
	for range 100 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := rawJoin{Secret: bad}.run(context.Background(), l.Endpoint)
			if err == nil && out.PAKEErr != nil {
				failures.Add(1)
			}
		}()
	}
	wg.Wait()
	if counted.Load() > 10 {
		t.Fatalf("%d KE2s from the live code's record: more than 10 guesses", counted.Load())
	}
	if counted.Load() != 10 || failures.Load() != 100 {
		t.Fatalf("counted %d, failed %d", counted.Load(), failures.Load())
	}
	c, _ := l.Admin.Code(context.Background(), code.ID)
	if c.State != "revoked" || c.RevokedBy != cluster.BurnedBy || c.FailedAttempts != 10 {
		t.Fatalf("code %+v", c)
	}
	t.Logf("100 concurrent wrong attempts: %d counted KE2s while live, %d uncounted for the burned code", counted.Load(), uncounted.Load())
}

func TestMaxUsesUnderRace(t *testing.T) {
	for _, max := range []int{1, 3} {
		t.Run("max"+string(rune('0'+max)), func(t *testing.T) {
			// 50 holders from one address at once: under -race more of them
			// wait for a refund than --budget-wait allows, so lift the budget
			l := listenertest.Start(t, listenertest.Options{Config: listener.Config{UnprovenPerSource: -1}})
			sec, code := mint(t, l, adminapi.MintCodeRequest{AutoApprove: true, MaxUses: uses(max)})
			var wg sync.WaitGroup
			var joined, usedUp atomic.Int32
			for range 50 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, _, err := join(t, l, sec, wire.Facts{})
					var refused *agent.RefusedError
					switch {
					case err == nil:
						joined.Add(1)
					case errors.As(err, &refused) && refused.Code == wire.CodeUsedUp:
						usedUp.Add(1)
					default:
						t.Errorf("join: %v", err)
					}
				}()
			}
			wg.Wait()
			if joined.Load() != int32(max) || usedUp.Load() != int32(50-max) {
				t.Fatalf("%d joined, %d used up; want %d", joined.Load(), usedUp.Load(), max)
			}
			nodes, _ := l.Admin.Nodes(context.Background())
			c, _ := l.Admin.Code(context.Background(), code.ID)
			if len(nodes) != max || c.Uses != max || c.Registrations != max || c.FailedAttempts != 0 {
				t.Fatalf("%d nodes, code %+v", len(nodes), c)
			}
		})
	}
}

func TestCARotationMakesCodesStale(t *testing.T) {
	l := listenertest.Start(t, listenertest.Options{})
	old, oldCode := mint(t, l, adminapi.MintCodeRequest{AutoApprove: true})
	ca, err := l.Admin.RotateCA(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if ca.Fingerprint == oldCode.CAFingerprint {
		t.Fatal("rotation kept the fingerprint")
	}
	_, _, err = join(t, l, old, wire.Facts{})
	var refused *agent.RefusedError
	if !errors.As(err, &refused) || refused.Code != wire.CodeStale {
		t.Fatalf("old code after rotation: %v, want %s", err, wire.CodeStale)
	}
	fresh, code := mint(t, l, adminapi.MintCodeRequest{AutoApprove: true})
	if code.CAFingerprint != ca.Fingerprint {
		t.Fatalf("new code minted under %s", code.CAFingerprint)
	}
	j, _, err := join(t, l, fresh, wire.Facts{})
	if err != nil || j.Identity.CAFingerprint != ca.Fingerprint {
		t.Fatalf("new code: %v", err)
	}
}

func TestInactiveCodesRefusedByName(t *testing.T) {
	now := time.Now()
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	l := listenertest.Start(t, listenertest.Options{Config: listener.Config{Now: clock}})
	expiring, _ := mint(t, l, adminapi.MintCodeRequest{AutoApprove: true, TTLSeconds: 60})
	revoked, rc := mint(t, l, adminapi.MintCodeRequest{AutoApprove: true})
	if _, err := l.Admin.RevokeCode(context.Background(), rc.ID); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	now = now.Add(2 * time.Minute)
	mu.Unlock()
	for _, tc := range []struct {
		sec  joincode.Secret
		want string
	}{{expiring, wire.CodeExpired}, {revoked, wire.CodeRevoked}} {
		_, _, err := join(t, l, tc.sec, wire.Facts{})
		var refused *agent.RefusedError
		if !errors.As(err, &refused) || refused.Code != tc.want {
			t.Errorf("%s: %v", tc.want, err)
		}
	}
}

func TestUnknownSelectorLooksLive(t *testing.T) {
	l := listenertest.Start(t, listenertest.Options{})
	live, _ := mint(t, l, adminapi.MintCodeRequest{AutoApprove: true})
	unknownSel := "00"
	if live.Locator == unknownSel {
		unknownSel = "01"
	}
	unknown, _ := joincode.NewCode(unknownSel)
	ctx := context.Background()
	a, b := challenges(t, l, live, unknown)
	if a.ChallengeSize != b.ChallengeSize {
		t.Fatalf("challenge for a live code is %d bytes, for an unknown selector %d", a.ChallengeSize, b.ChallengeSize)
	}
	// replaying one KE1 against the unknown selector gets the same OPRF
	// evaluation, as a real record would give
	_, ke1 := mustKE1(t, unknown)
	c1, err := rawJoin{Secret: unknown, KE1: ke1, StopAfterChallenge: true}.run(ctx, l.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	c2, err := rawJoin{Secret: unknown, KE1: ke1, StopAfterChallenge: true}.run(ctx, l.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(c1.Challenge.KE2[:32], c2.Challenge.KE2[:32]) {
		t.Fatal("an unknown selector answered one blinded element two ways")
	}
	if bytes.Equal(c1.Challenge.KE2, c2.Challenge.KE2) {
		t.Fatal("KE2 did not use fresh nonces")
	}
}

func TestSecretFileModes(t *testing.T) {
	l := listenertest.Start(t, listenertest.Options{})
	sec, _ := mint(t, l, adminapi.MintCodeRequest{AutoApprove: true})
	_, state, err := join(t, l, sec, wire.Facts{})
	if err != nil {
		t.Fatal(err)
	}
	secret := map[string]bool{"ca.key": true, "listener.key": true, "opaque.key": true, "node.key": true}
	for _, root := range []string{l.DataDir, state} {
		err := filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
			if err != nil {
				return err
			}
			mode := fi.Mode().Perm()
			switch {
			case fi.IsDir() && mode != 0o700:
				t.Errorf("%s is %o, want 0700", p, mode)
			case secret[fi.Name()] && mode != 0o600:
				t.Errorf("%s is %o, want 0600", p, mode)
			case !fi.IsDir() && mode&0o022 != 0:
				t.Errorf("%s is writable by others: %o", p, mode)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"keys/ca.key", "keys/listener.key", "keys/opaque.key"} {
		if _, err := os.Stat(filepath.Join(l.DataDir, name)); err != nil {
			t.Errorf("expected secret file %s: %v", name, err)
		}
	}
}

func TestRetryAboveSourceRate(t *testing.T) {
	var verified, plain atomic.Int32
	l := listenertest.Start(t, listenertest.Options{Config: listener.WithHooks(listener.Config{RetryAbove: 1}, listener.Hooks{
		Accept: func(v bool) {
			if v {
				verified.Add(1)
			} else {
				plain.Add(1)
			}
		},
	})})
	sec, _ := mint(t, l, adminapi.MintCodeRequest{AutoApprove: true, MaxUses: uses(0)})
	for i := range 6 {
		if _, _, err := join(t, l, sec, wire.Facts{}); err != nil {
			t.Fatalf("join %d: %v", i, err)
		}
	}
	// the first connections are within the rate; the rest had to answer a
	// Retry, and still joined
	if plain.Load() == 0 || verified.Load() == 0 {
		t.Fatalf("%d connections without Retry, %d with", plain.Load(), verified.Load())
	}
}

func TestAgentGivesUpAfterThreeFailures(t *testing.T) {
	var hellos atomic.Int32
	l := listenertest.Start(t, listenertest.Options{Config: listener.WithHooks(listener.Config{}, listener.Hooks{
		Challenge: func(string, bool, bool) { hellos.Add(1) },
	})})
	sec, code := mint(t, l, adminapi.MintCodeRequest{AutoApprove: true})
	bad := wrongCode(t, sec)
	dir := filepath.Join(t.TempDir(), "state")
	for i := 1; i <= 3; i++ {
		_, err := agent.Join(context.Background(), agent.JoinConfig{StateDir: dir, Endpoint: l.Endpoint, Secret: bad})
		if i < 3 && !errors.Is(err, agent.ErrNotAccepted) {
			t.Fatalf("attempt %d: %v", i, err)
		}
		if i == 3 && !errors.Is(err, agent.ErrGaveUp) {
			t.Fatalf("third failure: %v, want ErrGaveUp", err)
		}
	}
	// a fourth run spends nothing: no exchange starts
	if _, err := agent.Join(context.Background(), agent.JoinConfig{StateDir: dir, Endpoint: l.Endpoint, Secret: bad}); !errors.Is(err, agent.ErrGaveUp) {
		t.Fatalf("fourth run: %v", err)
	}
	if hellos.Load() != 3 {
		t.Fatalf("%d exchanges, want 3", hellos.Load())
	}
	c, _ := l.Admin.Code(context.Background(), code.ID)
	if c.FailedAttempts != 3 {
		t.Fatalf("failedAttempts %d", c.FailedAttempts)
	}
}

func TestBadCSRRefused(t *testing.T) {
	l := listenertest.Start(t, listenertest.Options{})
	sec, code := mint(t, l, adminapi.MintCodeRequest{AutoApprove: true})
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	csr, _ := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	csr[len(csr)-3] ^= 0xff // break the signature
	out, err := rawJoin{Secret: sec, CSR: csr}.run(context.Background(), l.Endpoint)
	if err != nil || len(out.Results) != 1 || out.Results[0].Code != wire.CodeBadCSR {
		t.Fatalf("bad CSR: %v %+v", err, out.Results)
	}
	c, _ := l.Admin.Code(context.Background(), code.ID)
	if c.Uses != 0 || c.Registrations != 0 {
		t.Fatalf("a bad CSR consumed a use: %+v", c)
	}
	if _, _, err := join(t, l, sec, wire.Facts{}); err != nil {
		t.Fatalf("the code no longer joins after a bad CSR: %v", err)
	}
}

func TestMaxConnectionsRefusesBeyondTheBound(t *testing.T) {
	l := listenertest.Start(t, listenertest.Options{Config: listener.Config{MaxConnections: 1}})
	sec, _ := mint(t, l, adminapi.MintCodeRequest{AutoApprove: true})
	ctx := context.Background()
	held, err := dialJoin(ctx, l.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	str, err := held.OpenStreamSync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	str.Write([]byte{0}) // the listener accepts the stream and waits for a Hello
	deadline := time.Now().Add(5 * time.Second)
	var joinErr error
	for time.Now().Before(deadline) {
		_, joinErr = agent.Join(ctx, agent.JoinConfig{StateDir: filepath.Join(t.TempDir(), "s"), Endpoint: l.Endpoint, Secret: sec, DialTimeout: time.Second})
		var unreachable *agent.UnreachableError
		if errors.As(joinErr, &unreachable) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	var unreachable *agent.UnreachableError
	if !errors.As(joinErr, &unreachable) {
		t.Fatalf("a connection past the bound: %v, want it refused", joinErr)
	}
	held.CloseWithError(0, "")
	// the listener frees the slot when it sees the close: poll for the
	// join to succeed rather than sleep and hope
	for deadline := time.Now().Add(30 * time.Second); ; {
		_, _, err := join(t, l, sec, wire.Facts{})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("join once the held connection is gone: %v", err)
		}
		time.Sleep(50 * time.Millisecond) // polling for the join above
	}
}

// TestUnknownTokenLooksLive: a Hello naming a token locator no token has
// gets a Challenge of a live token's size and key stretching (none), not
// a join code's: the KSF field would tell a guesser the token is unknown.
func TestUnknownTokenLooksLive(t *testing.T) {
	l := listenertest.Start(t, listenertest.Options{})
	id := "jt_" + strings.Repeat("a", 26)
	exp := time.Now().Add(time.Hour)
	_, live, err := l.Mint(context.Background(), cluster.SecretSpec{
		Secret:    cluster.Secret{ID: id, Kind: cluster.KindToken, Tenant: "default", Pool: "default", Role: cluster.RoleNode, Trust: cluster.TrustPlatform, MaxUses: 1, ExpiresAt: &exp},
		EventType: cluster.EventTokenCreated,
	})
	if err != nil {
		t.Fatal(err)
	}
	unknown, err := joincode.NewToken("jt_" + strings.Repeat("b", 26))
	if err != nil {
		t.Fatal(err)
	}
	a, b := challenges(t, l, live, unknown)
	if a.ChallengeSize != b.ChallengeSize || a.Challenge.KSF != b.Challenge.KSF || !a.Challenge.KSF.None() {
		t.Fatalf("live token: %d bytes, KSF %+v; unknown token locator: %d bytes, KSF %+v", a.ChallengeSize, a.Challenge.KSF, b.ChallengeSize, b.Challenge.KSF)
	}
}

// challenges runs one exchange up to its Challenge with each secret.
func challenges(t *testing.T, l *listenertest.Listener, a, b joincode.Secret) (rawOutcome, rawOutcome) {
	t.Helper()
	run := func(sec joincode.Secret) rawOutcome {
		o, err := rawJoin{Secret: sec, StopAfterChallenge: true}.run(context.Background(), l.Endpoint)
		if err != nil {
			t.Fatal(err)
		}
		return o
	}
	return run(a), run(b)
}
