package systemd

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCredential(t *testing.T) {
	dir := t.TempDir()
	for name, content := range map[string]string{
		"join-code": "K7QX-3MPD-V9TA\n",
		"fallback":  "\n", // what SetCredential=join-code:\n gives
		"blank":     " \t\r\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	unreadable := filepath.Join(dir, "dir-not-file")
	if err := os.Mkdir(unreadable, 0o700); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		credDir string
		cred    string
		want    string
		wantOK  bool
		wantErr bool
	}{
		{"present", dir, JoinCodeCredential, "K7QX-3MPD-V9TA", true, false},
		{"fallback newline", dir, "fallback", "", false, false},
		{"only whitespace", dir, "blank", "", false, false},
		{"missing", dir, "nope", "", false, false},
		{"no credentials directory", "", JoinCodeCredential, "", false, false},
		{"not a file", dir, "dir-not-file", "", false, true},
		{"path in name", dir, "../join-code", "", false, true},
		{"dot dot", dir, "..", "", false, true},
		{"empty name", dir, "", "", false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("CREDENTIALS_DIRECTORY", tt.credDir)
			got, ok, err := Credential(tt.cred)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if err != nil && strings.Contains(err.Error(), "K7QX") {
				t.Errorf("error %q carries the secret", err)
			}
			if ok != tt.wantOK || string(got) != tt.want {
				t.Errorf("got %q, %v; want %q, %v", got, ok, tt.want, tt.wantOK)
			}
		})
	}
}
