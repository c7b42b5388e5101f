package bench

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/stratumjoin/stratum/agent"
	"github.com/stratumjoin/stratum/internal/joincode"
	"github.com/stratumjoin/stratum/internal/pake"
	"github.com/stratumjoin/stratum/internal/store"
	_ "github.com/stratumjoin/stratum/internal/store/boltstore" // the bolt: scheme
	"github.com/stratumjoin/stratum/internal/wire"
	"github.com/stratumjoin/stratum/pki"
)

// floorKit is what the floor server and its clients share: a CA, a TLS
// certificate and OPAQUE keys, and a record for each secret a client may
// join with.
type floorKit struct {
	caKey   *ecdsa.PrivateKey
	caCert  *x509.Certificate
	tls     tls.Certificate
	keys    *pake.ServerKeys
	records map[string]floorRecord
	fp      [32]byte
}

type floorRecord struct {
	record []byte
	ksf    pake.KSFParams
}

// floorTrustDomain is the floor CA's trust domain. The floor's certificates
// carry the SPIFFE identities an agent checks, so that the real agent joins
// the floor as it joins a listener, and each server is measured with the
// same client.
const floorTrustDomain = "floor.test"

// The secrets the floor holds records for, besides the floor clients' own
// "FL": the real agent joins the floor with the one of a case's kind and
// KSF. Both sides are this test binary, so they are constants (each code
// with its check symbol).
var (
	floorToken   = mustParseSecret("bcjt_jt_" + strings.Repeat("f", 26) + "." + strings.Repeat("0", 32))
	floorCode    = mustParseSecret("F100000000T") // stretched with pake.LightestKSF
	floorOldCode = mustParseSecret("F300000000J") // stretched with pake.DefaultKSF
)

// floorSecret is the floor's secret of a case: a token, or a code with the
// case's KSF.
func floorSecret(token bool, ksf pake.KSFParams) joincode.Secret {
	switch {
	case token:
		return floorToken
	case ksf == pake.DefaultKSF:
		return floorOldCode
	}
	return floorCode
}

func mustParseSecret(s string) joincode.Secret {
	sec, err := joincode.Parse(s)
	if err != nil {
		panic(err)
	}
	return sec
}

// newFloorKit makes the floor's keys and certificates; the floor clients'
// record "FL" is stretched with ksf.
func newFloorKit(ksf pake.KSFParams) (*floorKit, error) {
	k := &floorKit{records: map[string]floorRecord{}}
	var err error
	k.caKey, _ = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "floor CA"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, _ := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.caKey.PublicKey, k.caKey)
	k.caCert, _ = x509.ParseCertificate(der)
	leafKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	lt := &x509.Certificate{SerialNumber: big.NewInt(2), NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, DNSNames: []string{"floor"},
		BasicConstraintsValid: true, URIs: []*url.URL{{Scheme: "spiffe", Host: floorTrustDomain, Path: "/listener"}}}
	ld, _ := x509.CreateCertificate(rand.Reader, lt, k.caCert, &leafKey.PublicKey, k.caKey)
	k.tls = tls.Certificate{Certificate: [][]byte{ld, der}, PrivateKey: leafKey}
	if k.keys, err = pake.GenerateServerKeys(); err != nil {
		return nil, err
	}
	k.fp = sha256.Sum256(der)
	for _, r := range []struct {
		locator  string
		password []byte
		ksf      pake.KSFParams
	}{
		{"FL", []byte("FL000000000"), ksf},
		{floorToken.Locator, floorToken.Password(), pake.NoKSF},
		{floorCode.Locator, floorCode.Password(), pake.LightestKSF},
		{floorOldCode.Locator, floorOldCode.Password(), pake.DefaultKSF},
	} {
		rec, err := k.keys.Mint(r.locator, r.password, k.fp[:], r.ksf)
		if err != nil {
			return nil, err
		}
		k.records[r.locator] = floorRecord{rec, r.ksf}
	}
	return k, nil
}

// runFloorServer serves the floor: for each connection one QUIC server
// handshake, one KE2 and one certificate signature, nothing else. The real
// agent joins it with floorToken, floorCode or floorOldCode, the floor
// clients with their own record. It prints its address and serves until
// stdin closes. In the one-shot mode (STRATUM_BENCH_FLOOR=oneshot, the floor
// of a default token's join) the record has no KSF, the KE3 is checked, and
// the issued certificate is appended to a file in STRATUM_BENCH_FLOOR_DIR
// and fdatasynced before the Result: the one durable write a join must make
// on the server's side. The durable mode (STRATUM_BENCH_FLOOR=durable) is
// the default floor plus the durable writes this design makes per join, each
// an append and an fdatasync: for a join code's join the count before the
// KE2 leaves and the record before the Result (oneshot-bare is the one-shot
// floor without its KE3 check and its durable write); with
// STRATUM_BENCH_FLOOR_WRITES=1 (a token's or key's join, counted only if it
// fails) the record alone. With STRATUM_BENCH_FLOOR_STORE=bolt each of those
// writes is instead a transaction on the listener's own store (a bbolt file
// in STRATUM_BENCH_FLOOR_DIR, opened as the listener opens it) writing the
// keys the listener writes then: the secret's record for the count, and for
// the record the secret, node, join, join index, serial index and event, at
// their sizes in the listener's store.
func runFloorServer() int {
	mode := os.Getenv("STRATUM_BENCH_FLOOR")
	oneShot, durable := mode == "oneshot", mode == "durable"
	// oneshot-bare: the one-shot floor's record (no KSF) without its KE3
	// check and durable write, the bare floor a one-shot client can join
	bareOneShot := mode == "oneshot-bare"
	countBeforeKE2 := durable && os.Getenv("STRATUM_BENCH_FLOOR_WRITES") != "1"
	ksf := pake.LightestKSF
	if bareOneShot {
		ksf = pake.NoKSF
	}
	var journal *os.File
	var journalMu sync.Mutex
	appendSync := func(b []byte) error {
		journalMu.Lock()
		defer journalMu.Unlock()
		if _, err := journal.Write(b); err != nil {
			return err
		}
		return syscall.Fdatasync(int(journal.Fd()))
	}
	var countWrite, recordWrite func([]byte) error
	countWrite, recordWrite = appendSync, appendSync
	if durable && os.Getenv("STRATUM_BENCH_FLOOR_STORE") == "bolt" {
		dir := os.Getenv("STRATUM_BENCH_FLOOR_DIR")
		if dir == "" {
			dir = os.TempDir()
		}
		st, err := store.Open(context.Background(), "bolt:"+filepath.Join(dir, fmt.Sprintf("floor-%d.db", os.Getpid())))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer st.Close()
		fs := &floorStore{st: st}
		countWrite, recordWrite = fs.count, fs.record
	}
	if oneShot || durable {
		ksf = pake.NoKSF
		var err error
		dir := os.Getenv("STRATUM_BENCH_FLOOR_DIR")
		if dir == "" {
			dir = os.TempDir()
		}
		if journal, err = os.OpenFile(filepath.Join(dir, fmt.Sprintf("floor-%d.journal", os.Getpid())), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		// the file's own entry is made durable once, before any join
		err = journal.Sync()
		if err == nil {
			err = pki.SyncDir(filepath.Dir(journal.Name()))
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	k, err := newFloorKit(ksf)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// Nothing a join can do without: no session ticket (quic-go's server
	// seals one after every handshake unless told not to) and no path-MTU
	// probes, both of which the listener leaves out too, so they would
	// count in the floor only.
	ln, err := quic.ListenAddr("127.0.0.1:0",
		&tls.Config{Certificates: []tls.Certificate{k.tls}, NextProtos: []string{wire.ALPNJoin}, MinVersion: tls.VersionTLS13, SessionTicketsDisabled: true},
		&quic.Config{MaxIncomingStreams: 4, DisablePathMTUDiscovery: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(ln.Addr().(*net.UDPAddr).String())
	go func() {
		b := make([]byte, 1)
		os.Stdin.Read(b)
		ln.Close()
	}()
	for {
		conn, err := ln.Accept(context.Background())
		if err != nil {
			return 0
		}
		go func() {
			defer conn.CloseWithError(0, "")
			str, err := conn.AcceptStream(context.Background())
			if err != nil {
				return
			}
			cs := conn.ConnectionState()
			exp, _ := wire.Exporter(cs.TLS)
			var hello wire.Hello
			if wire.Read(str, &hello) != nil {
				return
			}
			rec, ok := k.records[hello.Locator]
			if !ok {
				return
			}
			ke2, login, err := k.keys.Respond(wire.BindingContext(exp), k.fp[:], hello.Locator, hello.KE1, rec.record)
			if err != nil {
				return
			}
			if countBeforeKE2 && countWrite([]byte(hello.Locator)) != nil {
				return
			}
			if wire.Write(str, &wire.Challenge{KE2: ke2, CAChain: [][]byte{k.caCert.Raw}, KSF: rec.ksf}) != nil {
				return
			}
			var proof wire.Proof
			if wire.Read(str, &proof) != nil {
				return
			}
			if oneShot && login.Finish(proof.KE3) != nil {
				return
			}
			csr, err := x509.ParseCertificateRequest(proof.CSR)
			if err != nil {
				return
			}
			// the identity an agent checks: a fresh node id in the
			// subject and as the SPIFFE ID, the one URI SAN
			nodeID, err := pki.NodeID()
			if err != nil {
				return
			}
			tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: nodeID}, NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
				BasicConstraintsValid: true, URIs: []*url.URL{{Scheme: "spiffe", Host: floorTrustDomain, Path: "/node/" + nodeID}}}
			der, err := x509.CreateCertificate(rand.Reader, tmpl, k.caCert, csr.PublicKey, k.caKey)
			if err != nil {
				return
			}
			if journal != nil {
				if recordWrite(der) != nil {
					return
				}
			}
			wire.Write(str, &wire.Result{Status: wire.StatusJoined, NodeID: nodeID, Role: pki.RoleNode, Trust: "platform", RenewAfter: time.Now().Add(30 * time.Minute).Unix(), CertChain: [][]byte{der}, CABundle: [][]byte{k.caCert.Raw}})
			str.Close()
			<-conn.Context().Done()
		}()
	}
}

// floorClient drives one floor exchange (no KSF: the KE3 is not checked).
func floorClient(ctx context.Context, addr string, csr []byte) error {
	conn, err := quic.DialAddr(ctx, addr, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{wire.ALPNJoin}}, nil)
	if err != nil {
		return err
	}
	defer conn.CloseWithError(0, "")
	str, err := helloChallenge(ctx, conn, "FL", []byte("FL000000000"))
	if err != nil {
		return err
	}
	if err := wire.Write(str, &wire.Proof{KE3: make([]byte, pake.KE3Size), CSR: csr}); err != nil {
		return err
	}
	var res wire.Result
	return wire.Read(str, &res)
}

// helloChallenge opens conn's join stream, sends a Hello for locator and
// reads the Challenge, the part of an exchange the floor client and the
// held connections share. Neither checks a KE3, so the KE1 carries no
// channel binding.
func helloChallenge(ctx context.Context, conn *quic.Conn, locator string, password []byte) (*quic.Stream, error) {
	str, err := conn.OpenStreamSync(ctx)
	if err != nil {
		return nil, err
	}
	_, ke1, err := pake.Start(make([]byte, 46), locator, password)
	if err != nil {
		return nil, err
	}
	if err := wire.Write(str, &wire.Hello{Version: wire.Version, Locator: locator, KE1: ke1}); err != nil {
		return nil, err
	}
	var ch wire.Challenge
	return str, wire.Read(str, &ch)
}

// floorStore makes the floor's durable writes as the listener's store
// transactions: one secret whose record every write rewrites, and per
// join the keys a join without hardware facts adds (no identity index).
type floorStore struct {
	st store.Store
	// mu makes the writes of the one secret queue, as the listener's
	// per-secret lock does, rather than fail their comparison and retry
	mu sync.Mutex
}

const floorSecretKey = "secret/floor"

// rewriteSecret reads the secret's record and writes it back in one
// transaction with ops, as the listener's count and join do.
func (f *floorStore) rewriteSecret(ops ...store.Op) error {
	ctx := context.Background()
	f.mu.Lock()
	defer f.mu.Unlock()
	for {
		kv, err := f.st.Get(ctx, floorSecretKey)
		if err != nil {
			return err
		}
		ok, err := f.st.Txn(ctx, []store.Cmp{{Key: floorSecretKey, Rev: kv.Rev}}, append(ops, store.Op{Key: floorSecretKey, Value: floorValue(1047)}))
		if err != nil || ok {
			return err
		}
	}
}

func (f *floorStore) count([]byte) error { return f.rewriteSecret() }

func (f *floorStore) record(der []byte) error {
	node, join := floorID(13), floorID(10)
	return f.rewriteSecret(
		store.Op{Key: "node/node-" + node, Value: floorValue(513)},
		store.Op{Key: "join/join-" + join, Value: floorValue(360)},
		store.Op{Key: "joinkey/floor/" + floorID(32), Value: floorValue(25)},
		store.Op{Key: "serial/" + floorID(16), Value: floorValue(40)},
		store.Op{Key: fmt.Sprintf("event/%020d", time.Now().UnixNano()), Value: floorValue(363)},
	)
}

func floorID(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%x", b)
}

func floorValue(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = 'x'
	}
	return b
}

// TestAgentJoinsTheFloor checks that the real agent joins every floor the
// join figures measure with it, with each of the floor's secrets, and
// takes the node identity the floor issues.
func TestAgentJoinsTheFloor(t *testing.T) {
	for _, env := range [][]string{
		{"STRATUM_BENCH_FLOOR=1"},
		{"STRATUM_BENCH_FLOOR=durable", "STRATUM_BENCH_FLOOR_DIR=" + t.TempDir()},
		{"STRATUM_BENCH_FLOOR=durable", "STRATUM_BENCH_FLOOR_STORE=bolt", "STRATUM_BENCH_FLOOR_WRITES=1", "STRATUM_BENCH_FLOOR_DIR=" + t.TempDir()},
	} {
		_, addr := startFloor(t, env...)
		for _, sec := range []joincode.Secret{floorToken, floorCode, floorOldCode} {
			j, err := agent.Join(t.Context(), agent.JoinConfig{StateDir: t.TempDir(), Endpoint: addr, Secret: sec})
			if err != nil {
				t.Fatalf("%v, %s: %v", env, sec.Kind, err)
			}
			if j.Identity.TrustDomain != floorTrustDomain || j.Identity.Role != pki.RoleNode || !pki.ValidNodeID(j.Identity.NodeID) {
				t.Errorf("%v, %s: joined as %s/%s/%s, want a node of %s", env, sec.Kind, j.Identity.TrustDomain, j.Identity.Role, j.Identity.NodeID, floorTrustDomain)
			}
		}
	}
}
