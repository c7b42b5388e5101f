// Command stratum-listener is the cluster's join listener and its admin
// command line. `init` and `serve` run the listener; every other
// subcommand talks to a running listener over its admin socket
// (--admin-socket, $STRATUM_ADMIN_SOCKET, default /run/stratum/admin.sock).
//
// Exit status: 0 done; 1 refused for good; 2 usage error, or a listener
// that cannot start for good (its unit does not restart it); 3 transient
// (the admin socket or the store unreachable).
package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/signal"
	"syscall"

	"github.com/stratumjoin/stratum/internal/cli"
	"github.com/stratumjoin/stratum/listener"
	"github.com/stratumjoin/stratum/listener/adminclient"
)

// exitCode is the exit contract (docs/operations.md): 2 usage or a cause
// no restart fixes (its unit does not restart it), 1 refused for good, 3
// transient.
func exitCode(err error) int {
	if code, ok := cli.ExitCode(err); ok {
		return code
	}
	switch {
	case errors.Is(err, listener.ErrNotInitialized), errors.Is(err, fs.ErrPermission):
		return cli.ExitUsage
	case errors.Is(err, adminclient.ErrUnreachable), errors.Is(err, adminclient.ErrTimeout):
		return cli.ExitTransient
	}
	return cli.ExitRefused
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := rootCommand().ExecuteContext(ctx)
	stop()
	if err != nil {
		var p *adminclient.ProblemError
		if errors.As(err, &p) && p.Transient() {
			// the listener answered, its store did not: say so, not "503"
			fmt.Fprintf(os.Stderr, "stratum-listener: %s (%s); nothing was changed, try again\n", p.Detail, p.Code)
			os.Exit(cli.ExitTransient)
		}
		fmt.Fprintln(os.Stderr, "stratum-listener:", err)
		os.Exit(exitCode(err))
	}
}
