package cli

import (
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// EnvName is the environment variable that sets flag name:
// STRATUM_ and the name upper-cased, dashes as underscores
// (--max-connections: STRATUM_MAX_CONNECTIONS).
func EnvName(flag string) string {
	return "STRATUM_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// FlagsFromEnv sets each of cmd's flags that the command line left alone
// from its STRATUM_ variable, so a unit's EnvironmentFile= configures
// what its fixed ExecStart= does not. The command line wins. A bad value
// is a usage error naming both the variable and the flag.
func FlagsFromEnv(cmd *cobra.Command, usage func(error) error) error {
	var err error
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if err != nil || f.Changed || f.Name == "help" || f.Name == "version" {
			return
		}
		v, ok := os.LookupEnv(EnvName(f.Name))
		if !ok {
			return
		}
		if serr := cmd.Flags().Set(f.Name, v); serr != nil {
			err = usage(fmt.Errorf("%s=%s (--%s): %w", EnvName(f.Name), v, f.Name, serr))
		}
	})
	return err
}
