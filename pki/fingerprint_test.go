package pki_test

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stratumjoin/stratum/pki"
)

const seedFingerprint = "7D:9F:05:39:12:F6:D4:91:0A:1B:2C:3D:4E:5F:60:71:82:93:A4:B5:C6:D7:E8:F9:0A:1B:2C:3D:4E:5F:60:71"

func TestFingerprintFormat(t *testing.T) {
	fp, err := pki.ParseFingerprint(seedFingerprint)
	if err != nil {
		t.Fatal(err)
	}
	if got := pki.FormatFingerprint(fp); got != seedFingerprint {
		t.Errorf("FormatFingerprint = %q, want the join-codes API's %q", got, seedFingerprint)
	}
	certs, err := pki.ParseCertsPEM(readFile(t, "testdata/certs/root.pem"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := pki.FormatFingerprint(sha256.Sum256(certs[0].Raw)), "EB:F3:AC:C1:F1:A0:89:A2:77:28:4A:52:CA:DB:F0:31:D8:5D:D0:E2:F0:C5:3D:9D:C9:81:1E:1B:14:8A:C5:F9"; got != want {
		t.Errorf("fingerprint of testdata root = %s, want what openssl dgst says, %s", got, want)
	}
}

func TestParseFingerprint(t *testing.T) {
	want, _ := hex.DecodeString(strings.ReplaceAll(seedFingerprint, ":", ""))
	tests := []struct {
		in string
		ok bool
	}{
		{seedFingerprint, true},
		{strings.ToLower(seedFingerprint), true},
		{strings.ReplaceAll(seedFingerprint, ":", ""), true},
		{strings.ToLower(strings.ReplaceAll(seedFingerprint, ":", "")), true},
		{"  " + seedFingerprint + "\n", true},
		{"", false},
		{seedFingerprint[:len(seedFingerprint)-3], false},
		{seedFingerprint + ":00", false},
		{strings.ReplaceAll(seedFingerprint, ":", "-"), false},
		{strings.Replace(seedFingerprint, ":", "", 1) + ":", false},
		{seedFingerprint[:len(seedFingerprint)-1] + "G", false},
		{"sha256:" + strings.ReplaceAll(seedFingerprint, ":", ""), false},
		{strings.Repeat("+", 64), false},
	}
	for _, tt := range tests {
		fp, err := pki.ParseFingerprint(tt.in)
		if (err == nil) != tt.ok {
			t.Errorf("ParseFingerprint(%q) error = %v, want ok=%v", tt.in, err, tt.ok)
			continue
		}
		if tt.ok && !bytes.Equal(fp[:], want) {
			t.Errorf("ParseFingerprint(%q) = %x", tt.in, fp)
		}
	}
}

func FuzzParseFingerprint(f *testing.F) {
	file, err := os.Open("testdata/fingerprints.txt")
	if err != nil {
		f.Fatal(err)
	}
	defer file.Close()
	sc := bufio.NewScanner(file)
	for sc.Scan() {
		if line := sc.Text(); !strings.HasPrefix(line, "#") {
			f.Add(line)
		}
	}
	f.Fuzz(func(t *testing.T, s string) {
		fp, err := pki.ParseFingerprint(s)
		if err != nil {
			return
		}
		canonical := pki.FormatFingerprint(fp)
		again, err := pki.ParseFingerprint(canonical)
		if err != nil || again != fp {
			t.Fatalf("%q parsed to %x, whose canonical form %q does not parse back (%v)", s, fp, canonical, err)
		}
		if !strings.EqualFold(strings.ReplaceAll(strings.TrimSpace(s), ":", ""), strings.ReplaceAll(canonical, ":", "")) {
			t.Fatalf("%q parsed to %s", s, canonical)
		}
	})
}

func FuzzParseCertsPEM(f *testing.F) {
	paths, err := filepath.Glob("testdata/certs/*.pem")
	if err != nil || len(paths) == 0 {
		f.Fatalf("no seed corpus in testdata/certs: %v", err)
	}
	for _, p := range paths {
		f.Add(readFile(f, p))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		certs, err := pki.ParseCertsPEM(data)
		if err != nil {
			return
		}
		again, err := pki.ParseCertsPEM(pki.EncodeCertsPEM(certs))
		if err != nil || len(again) != len(certs) {
			t.Fatalf("re-encoded bundle does not parse back: %v", err)
		}
		for i := range certs {
			if !bytes.Equal(certs[i].Raw, again[i].Raw) {
				t.Fatalf("certificate %d changed in the round trip", i)
			}
		}
	})
}

func readFile(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
