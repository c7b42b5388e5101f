package cli

import (
	"encoding/json"
	"fmt"
	"runtime"
	"runtime/debug"
	"time"

	"github.com/spf13/cobra"
)

// Set at link time by the Makefile (go build -ldflags "-X ..."), because a
// build with -buildvcs=false, or from a source tarball, has no VCS stamp.
var (
	version string // git describe
	commit  string // full commit hash
	date    string // commit date, RFC 3339
)

// BuildInfo is what `--version` and `version --json` print.
type BuildInfo struct {
	Module  string `json:"module,omitempty"`
	Version string `json:"version"`
	Commit  string `json:"commit"`
	// Date is RFC 3339 in UTC, left out when the build has none.
	Date      string `json:"date,omitempty"`
	Modified  bool   `json:"modified"`
	GoVersion string `json:"goVersion"`
	Platform  string `json:"platform"`
	CGO       bool   `json:"cgo"`
}

// Build returns this binary's build information: the link-time values
// when set, else what the Go toolchain stamped (module version, vcs.*).
func Build() BuildInfo {
	b := BuildInfo{Version: "unknown", Commit: "unknown", GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if info, ok := debug.ReadBuildInfo(); ok {
		b.Module = info.Main.Path
		if v := info.Main.Version; v != "" && v != "(devel)" {
			b.Version = v
		}
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				b.Commit = s.Value
			case "vcs.time":
				b.Date = s.Value
			case "vcs.modified":
				b.Modified = s.Value == "true"
			case "CGO_ENABLED":
				b.CGO = s.Value == "1"
			}
		}
	}
	if version != "" {
		b.Version = version
	}
	if commit != "" {
		b.Commit = commit
	}
	if date != "" {
		b.Date = date
	}
	b.Date = utcTime(b.Date)
	return b
}

// utcTime is an RFC 3339 time in UTC, or "" when s is none.
func utcTime(s string) string {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return ""
	}
	return t.UTC().Format(time.RFC3339)
}

func (b BuildInfo) String() string {
	date := b.Date
	if date == "" {
		date = "date unknown"
	}
	s := fmt.Sprintf("%s (commit %s, %s, %s %s", b.Version, b.Commit, date, b.GoVersion, b.Platform)
	if b.Modified {
		s += ", modified"
	}
	return s + ")"
}

// AddVersion gives root a --version flag and a `version [--json]`
// command. jsonOut is the root's --json flag.
func AddVersion(root *cobra.Command, jsonOut *bool) {
	root.Version = Build().String()
	root.SetVersionTemplate("{{.Name}} {{.Version}}\n")
	root.AddCommand(&cobra.Command{
		Use:   "version",
		Short: "print the version, commit and build date",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if *jsonOut {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(Build())
			}
			fmt.Fprintln(cmd.OutOrStdout(), root.Name(), Build())
			return nil
		},
	})
}
