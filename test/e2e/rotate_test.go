package e2e

import (
	"context"
	"encoding/json"
	"path/filepath"
	"testing"
)

// TestCARotationCLI: `ca rotate` from the CLI revokes an old join code by
// system:ca-rotation (`codes show` says so), and its holder's
// `stratum-agent join --json` prints an object with the listener's code
// JOIN_CODE_STALE and the secret's kind, exit 1; `ca retire` from the CLI
// then reports how many secrets it revoked.
func TestCARotationCLI(t *testing.T) {
	l := newListener(t)
	var old, fresh mintedCode
	l.adminJSON(&old, "codes", "create", "--auto-approve")
	var ca struct {
		Fingerprint string `json:"caFingerprint"`
	}
	l.adminJSON(&ca, "ca", "rotate")
	var shown mintedCode
	l.adminJSON(&shown, "codes", "show", old.ID)
	if shown.State != "revoked" || shown.RevokedBy != "system:ca-rotation" {
		t.Fatalf("old code after ca rotate: %+v", shown)
	}
	r := agentJoin(context.Background(), l.endpoint, old.Code, filepath.Join(t.TempDir(), "old"), "--json")
	var refusal struct {
		Joined     bool   `json:"joined"`
		Code       string `json:"code"`
		SecretKind string `json:"secretKind"`
		Message    string `json:"message"`
	}
	if r.exit != 1 || json.Unmarshal([]byte(r.stdout), &refusal) != nil || refusal.Joined || refusal.Code != "JOIN_CODE_STALE" || refusal.SecretKind != "join code" || refusal.Message == "" {
		t.Fatalf("join --json with a stale code: exit %d stdout %q stderr %q", r.exit, r.stdout, r.stderr)
	}
	l.adminJSON(&fresh, "codes", "create", "--auto-approve")
	r = agentJoin(context.Background(), l.endpoint, fresh.Code, filepath.Join(t.TempDir(), "fresh"), "--json")
	var id struct {
		CAFingerprint string `json:"caFingerprint"`
	}
	if r.exit != 0 || json.Unmarshal([]byte(r.stdout), &id) != nil || id.CAFingerprint != ca.Fingerprint {
		t.Fatalf("join with a fresh code: exit %d %s %s", r.exit, r.stdout, r.stderr)
	}
	var retired struct {
		Fingerprint    string `json:"caFingerprint"`
		RevokedSecrets int    `json:"revokedSecrets"`
	}
	l.adminJSON(&retired, "ca", "retire")
	if retired.Fingerprint != ca.Fingerprint || retired.RevokedSecrets != 0 { // the old code was revoked at rotation already
		t.Fatalf("ca retire: %+v", retired)
	}
}
