package agent

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"io/fs"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stratumjoin/stratum/internal/joincode"
)

// TestJoinWritesKeyWithNonce checks the first durable write of a join: a
// key made now lands with the attempt nonce, both 0600, and the key read
// back is the one the join signs with.
func TestJoinWritesKeyWithNonce(t *testing.T) {
	st := State{Dir: filepath.Join(t.TempDir(), "state")}
	key, fresh, tp, err := st.nodeKey("")
	if err != nil || tp != nil || fresh == nil {
		t.Fatalf("nodeKey: %v %v %v", fresh, tp, err)
	}
	if _, err := os.Stat(st.path(KeyFile)); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the key was written before the nonce batch: %v", err)
	}
	nonce, _, _, err := st.newAttempt("AB", fresh)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{KeyFile, attemptsFile} {
		fi, err := os.Stat(st.path(name))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s is %o, want 0600", name, fi.Mode().Perm())
		}
	}
	again, err := st.Key()
	if err != nil {
		t.Fatal(err)
	}
	if !again.(*ecdsa.PrivateKey).Equal(key) {
		t.Fatal("the key on disk is not the key the join uses")
	}
	// a restart resumes the nonce and writes no key again
	_, fresh, _, err = st.nodeKey("")
	if err != nil || fresh != nil {
		t.Fatalf("nodeKey after the write: %v %v", fresh, err)
	}
	resumed, _, _, err := st.newAttempt("AB", nil)
	if err != nil || string(resumed) != string(nonce) {
		t.Fatalf("resume: %x, want %x (%v)", resumed, nonce, err)
	}
}

// TestCredentialsForgetNonces checks the commit of a join: the joined
// locator's nonces go with it (the file goes when they were all it held),
// and another locator's stay.
func TestCredentialsForgetNonces(t *testing.T) {
	st := State{Dir: filepath.Join(t.TempDir(), "state")}
	for _, loc := range []string{"AB", "CD"} {
		if _, _, _, err := st.newAttempt(loc, nil); err != nil {
			t.Fatal(err)
		}
	}
	ca, leaf := testChain(t)
	id := Identity{NodeID: "n1", Role: "node"}
	if err := st.saveCredentials([]*x509.Certificate{leaf}, []*x509.Certificate{ca}, id, "AB"); err != nil {
		t.Fatal(err)
	}
	m, err := st.readAttempts()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := m["AB"]; ok || len(m["CD"]) != 1 {
		t.Fatalf("attempts after joining with AB: %v", m)
	}
	if err := st.saveCredentials([]*x509.Certificate{leaf}, []*x509.Certificate{ca}, id, "CD"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(st.path(attemptsFile)); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("attempts.json left after its last locator joined: %v", err)
	}
	if got, ok, err := st.Identity(); err != nil || !ok || got.NodeID != "n1" {
		t.Fatalf("identity: %v %v %v", got, ok, err)
	}
	fi, err := os.Stat(st.path(NodeFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("node.json: %v %v", fi, err)
	}
}

func testChain(t *testing.T) (ca, leaf *x509.Certificate) {
	t.Helper()
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "ca"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ = x509.ParseCertificate(der)
	lt := &x509.Certificate{SerialNumber: big.NewInt(2), NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err = x509.CreateCertificate(rand.Reader, lt, ca, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ = x509.ParseCertificate(der)
	return ca, leaf
}

// TestJoinUnreachableLeavesNonce checks that a join whose dial fails
// still returns only once its key and, for a join code, its nonce are
// written: the write runs alongside the handshake, and no return leaves it
// in flight. A token's start is counted only if it ends unproven, and
// never burns: its nonce is not written at all.
func TestJoinUnreachableLeavesNonce(t *testing.T) {
	code, err := joincode.NewCode("AB")
	if err != nil {
		t.Fatal(err)
	}
	token, err := joincode.Parse("bcjt_jt_00000000000000000000000000.0000000000000000000000000000000000000000000000000000")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		sec    joincode.Secret
		nonces int
	}{{code, 1}, {token, 0}} {
		t.Run(tc.sec.Kind.String(), func(t *testing.T) {
			st := State{Dir: filepath.Join(t.TempDir(), "state")}
			_, err := Join(context.Background(), JoinConfig{StateDir: st.Dir, Endpoint: "127.0.0.1:1", Secret: tc.sec, DialTimeout: 200 * time.Millisecond})
			var unreachable *UnreachableError
			if !errors.As(err, &unreachable) {
				t.Fatalf("join: %v, want unreachable", err)
			}
			m, err := st.readAttempts()
			if err != nil || len(m[tc.sec.Locator]) != tc.nonces {
				t.Fatalf("attempts after the failed dial: %v %v, want %d nonces", m, err, tc.nonces)
			}
			if _, err := st.Key(); err != nil {
				t.Fatal(err)
			}
		})
	}
}
