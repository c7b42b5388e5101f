package authority

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestLoadCAAfterInterruptedRotation cuts a rotation short at each step
// and checks that LoadCA lands on a consistent CA: the new one once the
// commit point (next-ca.key renamed to ca.key) is reached or staging is
// complete, the old one before that.
func TestLoadCAAfterInterruptedRotation(t *testing.T) {
	tests := []struct {
		name    string
		crash   func(t *testing.T, d KeyDir)
		wantNew bool
	}{
		{"staged, not committed", func(t *testing.T, d KeyDir) {}, true},
		{"ca.key renamed, ca.crt not yet", func(t *testing.T, d KeyDir) {
			mustRename(t, d, nextCAKeyFile, CAKeyFile)
		}, true},
		{"staging cut before next-ca.key", func(t *testing.T, d KeyDir) {
			mustRemove(t, d, nextCAKeyFile)
		}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := KeyDir{Path: filepath.Join(t.TempDir(), "keys")}
			now := time.Now()
			old, err := NewRootCA("test.example", now)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := d.Init(old, ListenerConfig{TrustDomain: "test.example"}, now); err != nil {
				t.Fatal(err)
			}
			next, cross, err := old.Rotate("test.example", now)
			if err != nil {
				t.Fatal(err)
			}
			if err := d.stageRotation(old, next, cross); err != nil {
				t.Fatal(err)
			}
			tt.crash(t, d)

			loaded, err := d.LoadCA()
			if err != nil {
				t.Fatalf("LoadCA: %v", err)
			}
			want := old
			if tt.wantNew {
				want = next
			}
			if loaded.Fingerprint() != want.Fingerprint() {
				t.Errorf("LoadCA gave the %s CA", map[bool]string{true: "old", false: "new"}[tt.wantNew])
			}
			for _, name := range []string{nextCAKeyFile, nextCACertFile} {
				if _, err := os.Lstat(d.file(name)); err == nil {
					t.Errorf("%s left behind", name)
				}
			}
			roots, err := d.Roots()
			if err != nil || !roots[0].Equal(next.Root()) {
				t.Errorf("roots.pem does not start with the staged root: %v", err)
			}
			// The listener certificate, still the old CA's, is replaced on
			// the next start when the rotation went through.
			_, issued, err := d.LoadOrCreateListenerCert(loaded, "test.example", now)
			if err != nil || issued != tt.wantNew {
				t.Errorf("LoadOrCreateListenerCert issued=%v err=%v, want issued=%v", issued, err, tt.wantNew)
			}
		})
	}
}

func mustRename(t *testing.T, d KeyDir, from, to string) {
	t.Helper()
	if err := os.Rename(d.file(from), d.file(to)); err != nil {
		t.Fatal(err)
	}
}

func mustRemove(t *testing.T, d KeyDir, name string) {
	t.Helper()
	if err := os.Remove(d.file(name)); err != nil {
		t.Fatal(err)
	}
}
