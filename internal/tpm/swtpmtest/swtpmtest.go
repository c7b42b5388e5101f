// Package swtpmtest runs swtpm, a real TPM 2.0 simulator, for tests: on
// loopback TCP ports, with its state in a test's temporary directory, and
// optionally with an EK certificate issued by a test manufacturer CA.
package swtpmtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-tpm/tpm2"

	"github.com/stratumjoin/stratum/internal/tpm"
)

// Sim is one running swtpm.
type Sim struct {
	t        testing.TB
	Dir      string // its state directory
	port     int
	ctrlPort int
	cmd      *exec.Cmd
}

// Start starts swtpm with fresh state. It fails the test when swtpm is not
// installed (Debian package swtpm; .ci/run installs it).
func Start(t testing.TB) *Sim {
	t.Helper()
	if _, err := exec.LookPath("swtpm"); err != nil {
		t.Fatal("swtpm is not installed: apt-get install swtpm swtpm-tools")
	}
	s := &Sim{t: t, Dir: t.TempDir()}
	s.start()
	t.Cleanup(s.Stop)
	return s
}

// Locator is what `--tpm-sim` takes, prefixed for tpm.Open.
func (s *Sim) Locator() string { return tpm.SimPrefix + s.Addr() }

// Addr is the command port's address.
func (s *Sim) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

func freePorts() (int, int, error) {
	var ports []int
	var ls []net.Listener
	for range 2 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, 0, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	for _, l := range ls {
		l.Close()
	}
	return ports[0], ports[1], nil
}

func (s *Sim) start() {
	s.t.Helper()
	var lastErr error
	for try := 0; try < 5; try++ {
		p, q, err := freePorts()
		if err != nil {
			s.t.Fatal(err)
		}
		s.port, s.ctrlPort = p, q
		cmd := exec.Command("swtpm", "socket", "--tpm2",
			"--server", fmt.Sprintf("type=tcp,port=%d,bindaddr=127.0.0.1", p),
			"--ctrl", fmt.Sprintf("type=tcp,port=%d,bindaddr=127.0.0.1", q),
			"--tpmstate", "dir="+s.Dir, "--flags", "not-need-init,startup-clear")
		out, _ := os.Create(filepath.Join(s.Dir, "swtpm.log"))
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			s.t.Fatalf("start swtpm: %v", err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait(); out.Close() }()
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			c, err := net.DialTimeout("tcp", s.Addr(), time.Second)
			if err == nil {
				c.Close()
				s.cmd = cmd
				go func() { <-done }()
				return
			}
			select {
			case err := <-done:
				lastErr = fmt.Errorf("swtpm exited: %v", err)
				deadline = time.Time{}
			case <-time.After(20 * time.Millisecond):
			}
		}
		if lastErr == nil {
			cmd.Process.Kill()
			lastErr = errors.New("swtpm did not open its port")
		}
	}
	log, _ := os.ReadFile(filepath.Join(s.Dir, "swtpm.log"))
	s.t.Fatalf("swtpm: %v\n%s", lastErr, log)
}

// Stop ends swtpm; its state stays in Dir.
func (s *Sim) Stop() {
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Kill()
	// wait for the port to close so that a restart gets a clean state
	for range 200 {
		c, err := net.DialTimeout("tcp", s.Addr(), 100*time.Millisecond)
		if err != nil {
			break
		}
		c.Close()
		time.Sleep(10 * time.Millisecond)
	}
	s.cmd = nil
}

// Restart power-cycles the TPM: a new process on the same state, on new
// ports (so Locator changes).
func (s *Sim) Restart() {
	s.t.Helper()
	s.Stop()
	s.start()
}

// Open opens the simulator through go-tpm.
func (s *Sim) Open() *tpm.TPM {
	s.t.Helper()
	tp, err := tpm.Open(s.Locator())
	if err != nil {
		s.t.Fatal(err)
	}
	return tp
}

// Clear runs TPM2_Clear with platform authorisation: the storage root
// changes, so every key made under the old one is gone. The endorsement
// key stays.
func (s *Sim) Clear() {
	s.t.Helper()
	tp := s.Open()
	defer tp.Close()
	if _, err := (tpm2.Clear{AuthHandle: tpm2.AuthHandle{Handle: tpm2.TPMRHPlatform, Auth: tpm2.PasswordAuth(nil)}}).Execute(tp); err != nil {
		s.t.Fatalf("TPM2_Clear: %v", err)
	}
}

// EKHash is the TPM's EK hash.
func (s *Sim) EKHash() string {
	s.t.Helper()
	tp := s.Open()
	defer tp.Close()
	h, err := tp.EKHash()
	if err != nil {
		s.t.Fatal(err)
	}
	return h
}

// CA is a test TPM manufacturer's root.
type CA struct {
	Cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// NewCA makes a manufacturer root.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name + " EK Root CA", Organization: []string{name}},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &CA{Cert: cert, key: key}
}

// TCG attribute OIDs of the EK certificate's subjectAltName.
var (
	oidSAN             = asn1.ObjectIdentifier{2, 5, 29, 17}
	oidTPMManufacturer = asn1.ObjectIdentifier{2, 23, 133, 2, 1}
	oidTPMModel        = asn1.ObjectIdentifier{2, 23, 133, 2, 2}
	oidTPMVersion      = asn1.ObjectIdentifier{2, 23, 133, 2, 3}
	oidEKCertificate   = asn1.ObjectIdentifier{2, 23, 133, 8, 1}
)

// Provision issues an EK certificate for the simulator's EK, shaped as the
// TCG EK profile has it (an empty subject, a critical subjectAltName naming
// the TPM), and writes it to the EK certificate NV index as a platform
// manufacturer does.
func (s *Sim) Provision(ca *CA) *x509.Certificate {
	s.t.Helper()
	tp := s.Open()
	defer tp.Close()
	ek, err := tpm2.CreatePrimary{PrimaryHandle: tpm2.TPMRHEndorsement, InPublic: tpm2.New2B(tpm2.RSAEKTemplate)}.Execute(tp)
	if err != nil {
		s.t.Fatal(err)
	}
	tpm2.FlushContext{FlushHandle: ek.ObjectHandle}.Execute(tp)
	area, err := ek.OutPublic.Contents()
	if err != nil {
		s.t.Fatal(err)
	}
	pub, err := tpm2.Pub(*area)
	if err != nil {
		s.t.Fatal(err)
	}
	dirName, err := asn1.Marshal(pkix.Name{ExtraNames: []pkix.AttributeTypeAndValue{
		{Type: oidTPMManufacturer, Value: "id:53575450"}, {Type: oidTPMModel, Value: "swtpm"}, {Type: oidTPMVersion, Value: "id:20191023"},
	}}.ToRDNSequence())
	if err != nil {
		s.t.Fatal(err)
	}
	san, err := asn1.Marshal([]asn1.RawValue{{Class: asn1.ClassContextSpecific, Tag: 4, IsCompound: true, Bytes: dirName}})
	if err != nil {
		s.t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageKeyEncipherment,
		UnknownExtKeyUsage:    []asn1.ObjectIdentifier{oidEKCertificate},
		BasicConstraintsValid: true,
		ExtraExtensions:       []pkix.Extension{{Id: oidSAN, Critical: true, Value: san}},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, pub, ca.key)
	if err != nil {
		s.t.Fatal(err)
	}
	platform := tpm2.AuthHandle{Handle: tpm2.TPMRHPlatform, Auth: tpm2.PasswordAuth(nil)}
	def := tpm2.NVDefineSpace{AuthHandle: platform, PublicInfo: tpm2.New2B(tpm2.TPMSNVPublic{
		NVIndex: tpm2.TPMHandle(tpm.EKCertIndex), NameAlg: tpm2.TPMAlgSHA256,
		Attributes: tpm2.TPMANV{PPWrite: true, PPRead: true, OwnerRead: true, AuthRead: true, NoDA: true, PlatformCreate: true, NT: tpm2.TPMNTOrdinary},
		DataSize:   uint16(len(der)),
	})}
	if _, err := def.Execute(tp); err != nil {
		s.t.Fatalf("define EK certificate index: %v", err)
	}
	rp, err := tpm2.NVReadPublic{NVIndex: tpm2.TPMHandle(tpm.EKCertIndex)}.Execute(tp)
	if err != nil {
		s.t.Fatal(err)
	}
	idx := tpm2.NamedHandle{Handle: tpm2.TPMHandle(tpm.EKCertIndex), Name: rp.NVName}
	for off := 0; off < len(der); off += 512 {
		end := min(off+512, len(der))
		if _, err := (tpm2.NVWrite{AuthHandle: platform, NVIndex: idx, Data: tpm2.TPM2BMaxNVBuffer{Buffer: der[off:end]}, Offset: uint16(off)}).Execute(tp); err != nil {
			s.t.Fatalf("write EK certificate: %v", err)
		}
	}
	cert, _ := x509.ParseCertificate(der)
	return cert
}
