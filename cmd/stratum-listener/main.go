// Command stratum-listener is the cluster's join listener and its admin
// command line. `init` and `serve` run the listener; every other
// subcommand talks to a running listener over its admin socket
// ($STRATUM_ADMIN_SOCKET, default /run/stratum/admin.sock).
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/stratumjoin/stratum/listener/adminclient"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := rootCommand().ExecuteContext(ctx)
	stop()
	if err != nil {
		var u usageError
		var p *adminclient.ProblemError
		switch {
		case errors.As(err, &p) && p.Transient():
			// the listener answered, its store did not: say so, not "503"
			fmt.Fprintf(os.Stderr, "stratum-listener: %s (%s); nothing was changed, try again\n", p.Detail, p.Code)
			os.Exit(3)
		}
		fmt.Fprintln(os.Stderr, "stratum-listener:", err)
		switch {
		case errors.As(err, &u):
			os.Exit(2)
		case errors.Is(err, adminclient.ErrUnreachable), errors.Is(err, adminclient.ErrTimeout):
			os.Exit(3)
		}
		os.Exit(1)
	}
}
