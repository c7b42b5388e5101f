// Package cli holds what both command lines share: the exit contract's
// statuses and the error that carries one, --json printing, the check
// that a command group was given a known subcommand, and version
// information from the build.
//
// Exit statuses (docs/operations.md): 0 done; 1 refused for good; 2 usage
// error, or a cause no restart can fix (a bad flag, an unknown command, a
// data directory never initialised, no permission); 3 transient (the
// listener or its store unreachable or unavailable): trying again later
// may work.
package cli

import (
	"fmt"

	"github.com/spf13/cobra"
)

// The exit statuses of both binaries.
const (
	ExitRefused   = 1
	ExitUsage     = 2
	ExitTransient = 3
)

// RequireSubcommands walks the tree under root and makes each command
// group (a command with subcommands and nothing to run itself) print its
// help when called alone, and refuse an unknown subcommand with
// usage(err) instead of printing help and exiting 0.
func RequireSubcommands(root *cobra.Command, usage func(error) error) {
	for _, c := range root.Commands() {
		RequireSubcommands(c, usage)
	}
	if !root.HasSubCommands() || root.Runnable() {
		return
	}
	root.Args = cobra.ArbitraryArgs
	root.RunE = func(cmd *cobra.Command, args []string) error {
		if len(args) == 0 {
			return cmd.Help()
		}
		if cmd.SuggestionsMinimumDistance <= 0 {
			cmd.SuggestionsMinimumDistance = 2 // cobra's own default
		}
		msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
		if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
			msg += fmt.Sprintf(" (did you mean %q?)", s[0])
		}
		return usage(fmt.Errorf("%s; run '%s --help' for the commands", msg, cmd.CommandPath()))
	}
}
