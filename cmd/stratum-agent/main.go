// Command stratum-agent is the node side of Stratum Join: `join` once at
// provisioning, `run` as a systemd service, `hwid` and `status` to look.
//
// Exit status: 0 joined; 1 refused for good; 2 usage error; 3 could not
// reach the listener.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := rootCommand().ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "stratum-agent:", err)
		os.Exit(exitCode(err))
	}
}
