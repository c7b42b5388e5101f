package listener_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"io"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/stratumjoin/stratum/internal/joincode"
	"github.com/stratumjoin/stratum/internal/pake"
	"github.com/stratumjoin/stratum/internal/wire"
)

// rawJoin speaks the join protocol by hand, so tests can send what a
// well-behaved agent never would.
type rawJoin struct {
	Secret joincode.Secret
	// KE1, when set, is sent instead of a fresh one (replays).
	KE1 []byte
	// CSR, when set, replaces a plain CSR for a fresh key.
	CSR   []byte
	Facts wire.Facts
	// StopAfterChallenge sends nothing after reading the Challenge.
	StopAfterChallenge bool
	// StopAtPending returns at the first pending Result.
	StopAtPending bool
	// TPM is sent in the Proof; OnTPM answers the listener's TPM
	// challenge (nil: send nothing more).
	TPM   *wire.TPMClaim
	OnTPM func(*wire.TPMChallenge) *wire.TPMAnswer
}

type rawOutcome struct {
	Challenge     wire.Challenge
	ChallengeSize int
	PAKEErr       error
	Results       []wire.Result
}

func dialJoin(ctx context.Context, endpoint string) (*quic.Conn, error) {
	return quic.DialAddr(ctx, endpoint, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{wire.ALPNJoin}, MinVersion: tls.VersionTLS13},
		&quic.Config{HandshakeIdleTimeout: 10 * time.Second, MaxIdleTimeout: 30 * time.Second})
}

func (r rawJoin) run(ctx context.Context, endpoint string) (rawOutcome, error) {
	var out rawOutcome
	conn, err := dialJoin(ctx, endpoint)
	if err != nil {
		return out, err
	}
	defer conn.CloseWithError(0, "")
	cs := conn.ConnectionState()
	exp, err := wire.Exporter(cs.TLS)
	if err != nil {
		return out, err
	}
	str, err := conn.OpenStreamSync(ctx)
	if err != nil {
		return out, err
	}
	return r.exchange(str, exp)
}

// exchange is the join over one stream whose channel binding is exp.
func (r rawJoin) exchange(str io.ReadWriter, exp []byte) (rawOutcome, error) {
	var out rawOutcome
	login, ke1, err := pake.Start(wire.BindingContext(exp), r.Secret.Locator, r.Secret.Password())
	if err != nil {
		return out, err
	}
	if r.KE1 != nil {
		ke1 = r.KE1
	}
	if err := wire.Write(str, &wire.Hello{Version: wire.Version, Locator: r.Secret.Locator, KE1: ke1}); err != nil {
		return out, err
	}
	typ, body, err := wire.ReadFrame(str)
	if err != nil {
		return out, err
	}
	out.ChallengeSize = 5 + len(body)
	if typ == wire.TypeResult { // refused before any KE2
		var res wire.Result
		if err := wire.Decode(typ, body, &res); err != nil {
			return out, err
		}
		out.Results = append(out.Results, res)
		return out, nil
	}
	if err := wire.Decode(typ, body, &out.Challenge); err != nil {
		return out, err
	}
	if r.StopAfterChallenge {
		return out, nil
	}
	root, err := x509.ParseCertificate(out.Challenge.CAChain[len(out.Challenge.CAChain)-1])
	if err != nil {
		return out, err
	}
	fp := sha256.Sum256(root.Raw)
	ke3, _, err := login.Finish(out.Challenge.KE2, fp[:], out.Challenge.KSF)
	if err != nil {
		out.PAKEErr = err
		return out, nil
	}
	csr := r.CSR
	if csr == nil {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		csr, _ = x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	}
	if err := wire.Write(str, &wire.Proof{KE3: ke3, CSR: csr, Facts: r.Facts, TPM: r.TPM}); err != nil {
		return out, err
	}
	for {
		var res wire.Result
		typ, body, err := wire.ReadFrame(str)
		if err != nil {
			return out, err
		}
		if typ == wire.TypeTPMChallenge && r.OnTPM != nil {
			var ch wire.TPMChallenge
			if err := wire.Decode(typ, body, &ch); err != nil {
				return out, err
			}
			ans := r.OnTPM(&ch)
			if ans == nil {
				return out, nil
			}
			if err := wire.Write(str, ans); err != nil {
				return out, err
			}
			continue
		}
		if err := wire.Decode(typ, body, &res); err != nil {
			return out, err
		}
		out.Results = append(out.Results, res)
		if res.Status != wire.StatusPending || r.StopAtPending {
			return out, nil
		}
	}
}

// wrongCode returns a valid code for the same selector that is not sec.
func wrongCode(t testing.TB, sec joincode.Secret) joincode.Secret {
	t.Helper()
	for {
		w, err := joincode.NewCode(sec.Locator)
		if err != nil {
			t.Fatal(err)
		}
		if string(w.Password()) != string(sec.Password()) {
			return w
		}
	}
}

func mustKE1(t testing.TB, sec joincode.Secret) (*pake.ClientLogin, []byte) {
	t.Helper()
	l, ke1, err := pake.Start(wire.BindingContext(make([]byte, 32)), sec.Locator, sec.Password())
	if err != nil {
		t.Fatal(err)
	}
	return l, ke1
}
