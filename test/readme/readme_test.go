// Package readme checks what the README tells operators to type: its sample
// codes are codes, and its cloud-init snippet does not block.
package readme

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stratumjoin/stratum/internal/joincode"
)

func readme(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

var sampleCode = regexp.MustCompile(`\b[0-9A-Z]{5}-[0-9A-Z]{5}-[0-9A-Z]\b`)

// TestReadmeSamples: every sample join code in the README passes its own
// check symbol, so an operator copying one sees a wrong-code refusal, not
// a typo report.
func TestReadmeSamples(t *testing.T) {
	codes := sampleCode.FindAllString(readme(t), -1)
	if len(codes) == 0 {
		t.Fatal("no sample code found in README.md")
	}
	for _, c := range codes {
		if _, err := joincode.Parse(c); err != nil {
			t.Errorf("README sample %s: %v", c, err)
		}
	}
}

// TestCloudInitDoesNotBlock: the cloud-init snippet starts the agent with
// --no-block, so runcmd goes on while a join waits (a start job of a
// Type=notify unit lasts until READY=1, which is only once joined).
func TestCloudInitDoesNotBlock(t *testing.T) {
	text := readme(t)
	_, rest, ok := strings.Cut(text, "#cloud-config\n")
	if !ok {
		t.Fatal("no #cloud-config snippet in README.md")
	}
	snippet, _, _ := strings.Cut(rest, "```")
	_, runcmd, ok := strings.Cut(snippet, "runcmd:\n")
	if !ok {
		t.Fatal("cloud-init snippet has no runcmd")
	}
	starts := 0
	for _, line := range strings.Split(runcmd, "\n") {
		if !strings.Contains(line, "systemctl") {
			continue
		}
		if strings.Contains(line, "start") || strings.Contains(line, "--now") || strings.Contains(line, "restart") {
			starts++
			if !strings.Contains(line, "--no-block") {
				t.Errorf("runcmd line blocks until the agent has joined: %s", strings.TrimSpace(line))
			}
		}
		if strings.Contains(line, "is-active") {
			t.Errorf("runcmd line depends on the join having finished: %s", strings.TrimSpace(line))
		}
	}
	if starts == 0 {
		t.Error("cloud-init snippet never starts stratum-agent")
	}
}
