package agent_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stratumjoin/stratum/agent"
)

// TestWipeRemovesTPMBlobs: Wipe removes every file the agent keeps,
// the TPM key's blobs included, and only those.
func TestWipeRemovesTPMBlobs(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{agent.TPMPublicFile, agent.TPMPrivateFile, agent.CertFile, agent.CAFile, agent.NodeFile, agent.PendingFile, "attempts.json", "failures.json", "operator-notes.txt"} {
		if err := os.WriteFile(filepath.Join(dir, n), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := (agent.State{Dir: dir}).Wipe(); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 1 || ents[0].Name() != "operator-notes.txt" {
		var got []string
		for _, e := range ents {
			got = append(got, e.Name())
		}
		t.Errorf("after Wipe: %v, want only operator-notes.txt", got)
	}
	if err := (agent.State{Dir: dir}).Wipe(); err != nil {
		t.Errorf("second Wipe: %v", err)
	}
}
