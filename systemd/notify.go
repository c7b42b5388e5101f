package systemd

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
)

// Notifier sends sd_notify messages to the service manager. It reads
// NOTIFY_SOCKET once, in NewNotifier, so it keeps working if the variable is
// later removed from the environment (for example so that child processes do
// not inherit it). Without NOTIFY_SOCKET every method is a no-op that costs
// nothing and returns nil.
//
// A Notifier is safe for concurrent use: each message is one datagram on its
// own socket.
type Notifier struct {
	socket    string
	logger    *slog.Logger
	newTicker func(time.Duration) ticker
}

// NewNotifier returns a Notifier for the NOTIFY_SOCKET of this process.
// logger receives watchdog ping failures; nil discards them.
func NewNotifier(logger *slog.Logger) *Notifier {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Notifier{
		socket:    os.Getenv("NOTIFY_SOCKET"),
		logger:    logger,
		newTicker: newRealTicker,
	}
}

// Enabled reports whether the process was started with a NOTIFY_SOCKET,
// that is whether messages go anywhere.
func (n *Notifier) Enabled() bool { return n.socket != "" }

// Ready tells systemd that start-up is finished (READY=1), with a status line
// when status is not empty. For the agent that is once it holds a valid
// identity; for Type=notify units, units ordered after this one start then.
func (n *Notifier) Ready(status string) error {
	msg := daemon.SdNotifyReady
	if status != "" {
		msg += "\nSTATUS=" + oneLine(status)
	}
	return n.send(msg)
}

// Status sets the free-form status line that `systemctl status` shows.
func (n *Notifier) Status(status string) error {
	return n.send("STATUS=" + oneLine(status))
}

// Stopping tells systemd the service is shutting down (STOPPING=1).
func (n *Notifier) Stopping() error {
	return n.send(daemon.SdNotifyStopping)
}

// Watchdog sends one keep-alive ping (WATCHDOG=1).
func (n *Notifier) Watchdog() error {
	return n.send(daemon.SdNotifyWatchdog)
}

// send writes msg as one datagram to the notify socket. go-systemd's
// daemon.SdNotify would do the same but re-reads NOTIFY_SOCKET on each call;
// the message constants still come from there.
func (n *Notifier) send(msg string) error {
	if n.socket == "" {
		return nil
	}
	// A leading "@" selects the abstract namespace; net does the translation.
	conn, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: n.socket, Net: "unixgram"})
	if err != nil {
		return fmt.Errorf("sd_notify %s: %w", field(msg), err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte(msg)); err != nil {
		return fmt.Errorf("sd_notify %s: %w", field(msg), err)
	}
	return nil
}

// oneLine keeps a status to one line: sd_notify fields are newline
// separated, and a status can carry text that came from the network (a
// listener's refusal reason), which must not be able to add fields such as
// READY=1 or WATCHDOG=1.
func oneLine(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s)
}

// field names the message in errors without its free-form text.
func field(msg string) string {
	name, _, _ := strings.Cut(msg, "=")
	return name
}

// WatchdogInterval returns how often to send WATCHDOG=1: half of the unit's
// WatchdogSec, as systemd passes it in WATCHDOG_USEC, or 0 when the watchdog
// is off or meant for another process (WATCHDOG_PID). A malformed
// WATCHDOG_USEC is an error.
func WatchdogInterval() (time.Duration, error) {
	d, err := daemon.SdWatchdogEnabled(false)
	if err != nil {
		return 0, fmt.Errorf("watchdog interval: %w", err)
	}
	return d / 2, nil
}

// RunWatchdog sends WATCHDOG=1 right away and then every interval until ctx
// ends. It returns at once when interval is not positive or the Notifier has
// no socket. A failed ping is logged and the next tick tries again: the
// watchdog only needs one ping to arrive per WatchdogSec.
//
// Pings from RunWatchdog prove only that the process is alive and
// scheduled. A daemon that wants the watchdog to catch a stuck main loop
// calls Watchdog from that loop instead.
func (n *Notifier) RunWatchdog(ctx context.Context, interval time.Duration) {
	if interval <= 0 || n.socket == "" {
		return
	}
	t := n.newTicker(interval)
	defer t.Stop()
	failing := false
	ping := func() {
		err := n.Watchdog()
		switch {
		case err != nil && !failing:
			failing = true
			n.logger.Warn("systemd watchdog ping failed", slog.Any("err", err))
		case err == nil && failing:
			failing = false
			n.logger.Info("systemd watchdog ping works again")
		}
	}
	ping()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.Chan():
			ping()
		}
	}
}

// ticker is the part of time.Ticker RunWatchdog uses, so tests can tick by
// hand.
type ticker interface {
	Chan() <-chan time.Time
	Stop()
}

type realTicker struct{ t *time.Ticker }

func newRealTicker(d time.Duration) ticker { return realTicker{time.NewTicker(d)} }

func (r realTicker) Chan() <-chan time.Time { return r.t.C }
func (r realTicker) Stop()                  { r.t.Stop() }
