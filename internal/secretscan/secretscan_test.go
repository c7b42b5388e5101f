package secretscan

import (
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// The search finds a secret in each form it claims to, including a JSON
// byte field two levels deep, and reports nothing for a haystack without it.
func TestFindsEachForm(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef-the-oprf-seed")
	needles := []Needle{{Name: "seed", Bytes: secret}}
	inner, _ := json.Marshal(map[string][]byte{"opaque": secret})
	outer, _ := json.Marshal(map[string][]byte{"public": inner})
	for name, hay := range map[string][]byte{
		"raw":    append([]byte("xx"), secret...),
		"hex":    []byte("k=" + hex.EncodeToString(secret)),
		"base64": []byte(`"` + base64.StdEncoding.EncodeToString(secret) + `"`),
		"json2":  outer,
	} {
		if hits := Bytes(name, hay, needles); len(hits) == 0 {
			t.Errorf("%s: not found", name)
		}
	}
	if hits := Bytes("clean", []byte("nothing to see here, only public text 0123"), needles); len(hits) != 0 {
		t.Errorf("found in a clean haystack: %v", hits)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "db"), outer, 0o600); err != nil {
		t.Fatal(err)
	}
	if hits, err := Tree(dir, needles); err != nil || len(hits) == 0 {
		t.Errorf("tree: %v %v", hits, err)
	}
}

func TestWindowsFindAPartCopied(t *testing.T) {
	file := []byte("header-bytes|0123456789abcdef0123456789abcdef|trailer-bytes")
	seed := file[13:45]
	hay := []byte(`{"x":"` + base64.StdEncoding.EncodeToString(seed) + `"}`)
	if hits := Bytes("leak", hay, Windows("opaque.key", file, 24)); len(hits) == 0 {
		t.Fatal("a seed copied out of the key file is not found")
	}
}

// A secret with zero bytes in it, next to a long zero run, is still found.
func TestZeroRuns(t *testing.T) {
	secret := []byte("\x00\x00\x00seed-with-zeros\x00\x00inside\x00")
	hay := append(append(make([]byte, 1<<20), secret...), make([]byte, 1<<20)...)
	if hits := Bytes("zeros", hay, Windows("s", secret, 24)); len(hits) == 0 {
		t.Fatal("not found")
	}
}
