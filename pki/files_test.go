package pki_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stratumjoin/stratum/pki"
	"github.com/stratumjoin/stratum/pki/pkitest"
)

func TestWriteSecretFile(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "keys")
	path := filepath.Join(dir, "secret.key")

	if err := pki.WriteSecretFile(path, []byte("one")); err != nil {
		t.Fatal(err)
	}
	if m := pkitest.FileMode(t, dir); m != 0o700 {
		t.Errorf("created directory mode %#o, want 0700", m)
	}
	if m := pkitest.FileMode(t, path); m != 0o600 {
		t.Errorf("file mode %#o, want 0600", m)
	}
	if err := pki.WriteSecretFile(path, []byte("two")); err != nil {
		t.Fatal(err)
	}
	if got := string(readFile(t, path)); got != "two" {
		t.Errorf("content %q after overwrite", got)
	}
	pkitest.AssertOnly(t, dir, "secret.key")
}

func TestWriteSecretFileNeverWidens(t *testing.T) {
	tests := []struct {
		before, after fs.FileMode
	}{
		{0o644, 0o600},
		{0o666, 0o600},
		{0o600, 0o600},
		{0o400, 0o400},
		{0o200, 0o200},
	}
	for _, tt := range tests {
		dir := privateDir(t)
		path := filepath.Join(dir, "k")
		if err := os.WriteFile(path, []byte("old"), tt.before); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, tt.before); err != nil { // past the umask
			t.Fatal(err)
		}
		if err := pki.WriteSecretFile(path, []byte("new")); err != nil {
			t.Fatal(err)
		}
		if m := pkitest.FileMode(t, path); m != tt.after {
			t.Errorf("%#o file became %#o, want %#o", tt.before, m, tt.after)
		}
		pkitest.AssertOnly(t, dir, "k")
	}
}

func TestWriteSecretFileRefusesOpenDirectory(t *testing.T) {
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	err := pki.WriteSecretFile(filepath.Join(dir, "k"), []byte("secret"))
	if err == nil || !strings.Contains(err.Error(), "0700") {
		t.Fatalf("error = %v, want a refusal naming 0700", err)
	}
	pkitest.AssertOnly(t, dir)
}

func TestWriteSecretFileCleansUpOnFailure(t *testing.T) {
	dir := privateDir(t)
	// Renaming a file over a non-empty directory fails after the
	// temporary file is written.
	target := filepath.Join(dir, "k")
	if err := os.MkdirAll(filepath.Join(target, "x"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := pki.WriteSecretFile(target, []byte("secret")); err == nil {
		t.Fatal("write over a directory succeeded")
	}
	pkitest.AssertOnly(t, dir, "k")
}

func TestWriteFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "node.crt")
	if err := pki.WriteFile(path, []byte("cert"), 0o644); err != nil {
		t.Fatal(err)
	}
	if m := pkitest.FileMode(t, path); m != 0o644 {
		t.Errorf("mode %#o, want 0644", m)
	}
	pkitest.AssertOnly(t, dir, "node.crt")
	if err := pki.WriteFile(filepath.Join(dir, "missing", "f"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if m := pkitest.FileMode(t, filepath.Join(dir, "missing")); m != 0o700 {
		t.Errorf("created directory mode %#o, want 0700", m)
	}
	if _, err := os.Stat(filepath.Join(dir, "nope", "x")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatal("unexpected file")
	}
}

// privateDir returns a new empty 0700 directory (t.TempDir's are 0755).
func privateDir(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "private")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestWriteFiles(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	files := []pki.File{{Name: "a.crt", Data: []byte("a"), Mode: 0o644}, {Name: "b.json", Data: []byte("b"), Mode: 0o600}}
	if err := pki.WriteFiles(dir, files); err != nil {
		t.Fatal(err)
	}
	if err := pki.WriteFiles(dir, []pki.File{{Name: "a.crt", Data: []byte("a2"), Mode: 0o644}, files[1]}); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		t.Fatalf("%d entries, temp files left behind?", len(entries))
	}
	for name, want := range map[string]struct {
		data string
		mode os.FileMode
	}{"a.crt": {"a2", 0o644}, "b.json": {"b", 0o600}} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		fi, _ := os.Stat(filepath.Join(dir, name))
		if err != nil || string(b) != want.data || fi.Mode().Perm() != want.mode {
			t.Errorf("%s: %q %o %v", name, b, fi.Mode().Perm(), err)
		}
	}
	if fi, _ := os.Stat(dir); fi.Mode().Perm() != 0o700 {
		t.Fatalf("dir %o", fi.Mode().Perm())
	}
	// a directory open to others is refused, as for secret files
	open := filepath.Join(t.TempDir(), "open")
	os.Mkdir(open, 0o755)
	os.Chmod(open, 0o755)
	if err := pki.WriteFiles(open, files); err == nil {
		t.Fatal("wrote into a 0755 directory")
	}
}

func TestCreateSecretFileIsExclusive(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "keys")
	path := filepath.Join(dir, "ca.key")
	if err := pki.CreateSecretFile(path, []byte("first")); err != nil {
		t.Fatal(err)
	}
	err := pki.CreateSecretFile(path, []byte("second"))
	if !errors.Is(err, fs.ErrExist) {
		t.Fatalf("second create: %v, want an exists error", err)
	}
	got, _ := os.ReadFile(path)
	entries, _ := os.ReadDir(dir)
	if string(got) != "first" || len(entries) != 1 {
		t.Errorf("content %q, %d entries; want the first write alone", got, len(entries))
	}
}
