package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/stratumjoin/stratum/agent"
	"github.com/stratumjoin/stratum/hwid"
	"github.com/stratumjoin/stratum/internal/cli"
	"github.com/stratumjoin/stratum/internal/joincode"
	"github.com/stratumjoin/stratum/internal/wire"
	"github.com/stratumjoin/stratum/pki"
	"github.com/stratumjoin/stratum/systemd"
)

func usage(format string, a ...any) error {
	return cli.Usage(fmt.Errorf(format, a...))
}

// exitCode is the exit contract (docs/operations.md): 2 usage or a cause
// no retry fixes on this machine, 1 refused for good, 3 transient.
func exitCode(err error) int {
	if code, ok := cli.ExitCode(err); ok {
		return code
	}
	var unreachable *agent.UnreachableError
	if errors.As(err, &unreachable) {
		return cli.ExitTransient
	}
	var refused *agent.RefusedError
	if errors.As(err, &refused) && refused.Retryable() {
		return cli.ExitTransient
	}
	if errors.Is(err, fs.ErrPermission) {
		return cli.ExitUsage
	}
	return cli.ExitRefused
}

var jsonOut bool

func rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "stratum-agent",
		Short:         "Stratum Join agent: joins this machine to a cluster with a join code",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return cli.Exit(cli.ExitUsage, err) })
	root.PersistentFlags().BoolVar(&jsonOut, "json", false, "print JSON")
	root.AddCommand(joinCommand(), runCommand(), hwidCommand(), statusCommand(), tpmCommand(), renewCommand(), leaveCommand())
	cli.AddVersion(root, &jsonOut)
	cli.AddDocs(root)
	cli.RequireSubcommands(root, func(err error) error { return cli.Exit(cli.ExitUsage, err) })
	return root
}

func noArgs(cmd *cobra.Command, a []string) error {
	if len(a) > 0 {
		return usage("%s takes no arguments (got %q)", cmd.CommandPath(), a[0])
	}
	return nil
}

type hwidFlags struct {
	root string
	nics []string
}

func (h *hwidFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&h.root, "root", "/", "filesystem root to read DMI below (tests point it at a sysfs tree)")
	cmd.Flags().StringSliceVar(&h.nics, "nic", nil, "count this interface as a NIC even if it is virtual (repeatable)")
}

func (h *hwidFlags) collect(ctx context.Context, logger *slog.Logger) (hwid.Report, error) {
	return hwid.Collect(ctx, hwid.Config{Root: h.root, IncludeInterfaces: h.nics, Logger: logger})
}

// readSecret takes the code from --code-file, --code - (stdin), --code X
// (with a warning), the systemd credential, or a TTY prompt.
func readSecret(cmd *cobra.Command, code, codeFile string) (joincode.Secret, error) {
	var raw string
	switch {
	case code != "" && codeFile != "":
		return joincode.Secret{}, usage("give --code or --code-file, not both")
	case codeFile != "":
		b, err := os.ReadFile(codeFile)
		if err != nil {
			return joincode.Secret{}, usage("read --code-file: %w", err)
		}
		raw = string(b)
	case code == "-":
		line, err := bufio.NewReader(cmd.InOrStdin()).ReadString('\n')
		if err != nil && !errors.Is(err, io.EOF) {
			return joincode.Secret{}, usage("read the code from stdin: %w", err)
		}
		raw = line
	case code != "":
		fmt.Fprintln(cmd.ErrOrStderr(), "warning: a code given on the command line is visible to every user through ps; prefer --code - or --code-file")
		raw = code
	default:
		if b, ok, err := systemd.Credential(systemd.JoinCodeCredential); err != nil {
			return joincode.Secret{}, err
		} else if ok {
			raw = string(b)
			break
		}
		if !term.IsTerminal(int(os.Stdin.Fd())) {
			return joincode.Secret{}, usage("no code given: use --code-file F, --code - (stdin), or run on a terminal to be asked")
		}
		fmt.Fprint(cmd.ErrOrStderr(), "join code: ")
		b, err := term.ReadPassword(int(os.Stdin.Fd()))
		fmt.Fprintln(cmd.ErrOrStderr())
		if err != nil {
			return joincode.Secret{}, usage("read the code: %w", err)
		}
		raw = string(b)
	}
	sec, err := joincode.Parse(strings.TrimSpace(raw))
	if err != nil {
		return joincode.Secret{}, usage("%w", err)
	}
	return sec, nil
}

func logger(level slog.Level) *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

func joinCommand() *cobra.Command {
	var cfg agent.JoinConfig
	var code, codeFile string
	var hw hwidFlags
	var tf tpmFlags
	var verbose bool
	var endpoints []string
	cmd := &cobra.Command{
		Use:   "join --endpoint HOST:PORT [--endpoint HOST:PORT...] (--code-file F | --code - | --code CODE)",
		Short: "join this machine once and write its identity to the state directory",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			eps := splitAll(endpoints)
			if len(eps) == 0 {
				eps = agent.SplitEndpoints(os.Getenv("STRATUM_ENDPOINT"))
			}
			if cfg.CAFingerprint == "" {
				cfg.CAFingerprint = os.Getenv("STRATUM_CA_FINGERPRINT")
			}
			if err := checkTargets(eps, cfg.CAFingerprint, "--endpoint (or STRATUM_ENDPOINT) is required"); err != nil {
				return err
			}
			if len(eps) == 0 {
				return usage("--endpoint (or STRATUM_ENDPOINT) is required")
			}
			if cfg.DialTimeout <= 0 {
				return usage("--dial-timeout must be positive, not %s", cfg.DialTimeout)
			}
			cfg.Endpoint, cfg.Endpoints = eps[0], eps[1:]
			// no core dump or ptrace peer may see the code
			if err := agent.ProtectSecrets(); err != nil {
				return err
			}
			sec, err := readSecret(cmd, code, codeFile)
			if err != nil {
				return err
			}
			level := slog.LevelWarn
			if verbose {
				level = slog.LevelDebug
			}
			cfg.Logger = logger(level)
			rep, err := hw.collect(cmd.Context(), cfg.Logger)
			if err != nil {
				return err
			}
			cfg.Secret, cfg.Facts = sec, rep.Facts
			if cfg.TPM, err = tf.locator(cfg.StateDir, cfg.Logger); err != nil {
				return err
			}
			cfg.OnPending = func(p agent.Pending) {
				fmt.Fprintf(cmd.ErrOrStderr(), "join %s waits for approval; its SAS is %s\n(the approver checks that `stratum-listener joins list` shows the same digits, then runs: stratum-listener joins approve %s --sas %s)\n", p.JoinID, p.SAS, p.JoinID, p.SAS)
			}
			j, err := agent.Join(cmd.Context(), cfg)
			if err != nil {
				shown := explainKind(err, cfg.Endpoint, sec.Kind.String())
				if jsonOut {
					_ = cli.PrintJSON(cmd.OutOrStdout(), refusalView(err, shown, sec))
				}
				return shown
			}
			return printJoined(cmd.OutOrStdout(), cfg.StateDir, j.Identity)
		},
	}
	cmd.Flags().StringArrayVar(&endpoints, "endpoint", nil, "a join listener, host[:port] (port 9444 unless given); repeat it (or separate by commas) for every listener of the cluster: the agent fails over to the next when one is down (default $STRATUM_ENDPOINT)")
	cmd.Flags().StringVar(&code, "code", "", "the join code; - reads it from stdin (on the command line, ps shows it)")
	cmd.Flags().StringVar(&codeFile, "code-file", "", "read the join code from this file")
	cmd.Flags().StringVar(&cfg.StateDir, "state", "/var/lib/stratum-agent", "state directory (0700)")
	cmd.Flags().StringVar(&cfg.CAFingerprint, "ca-fingerprint", "", "SHA-256 of the cluster root CA; the join fails if the listener proves another (default $STRATUM_CA_FINGERPRINT)")
	cmd.Flags().BoolVar(&verbose, "verbose", false, "log debug detail to stderr (never the code)")
	cmd.Flags().DurationVar(&cfg.DialTimeout, "dial-timeout", agent.DefaultDialTimeout, "how long to wait for a listener's handshake before exiting 3 (a busy listener holds new connections in its backlog for up to 25s)")
	hw.register(cmd)
	tf.register(cmd)
	return cmd
}

// checkTargets checks the endpoints and --ca-fingerprint before anything
// is dialled, so a typo is a usage error and not a retry loop. Each
// endpoint gets port 9444 when it names none (in place).
func checkTargets(endpoints []string, fingerprint, missing string) error {
	if len(endpoints) == 0 {
		return usage("%s", missing)
	}
	for i, e := range endpoints {
		ep, err := wire.Endpoint(e)
		if err != nil {
			return usage("--endpoint: %w", err)
		}
		endpoints[i] = ep
	}
	if fingerprint != "" {
		if _, err := pki.ParseFingerprint(fingerprint); err != nil {
			return usage("--ca-fingerprint: %w", err)
		}
	}
	return nil
}

// explain turns an error into the sentence the operator reads.
func explain(err error, endpoint string) error { return explainKind(err, endpoint, "join code") }

// explainKind is explain for a secret of the named kind (join code, join
// token, join key), which the sentence names.
func explainKind(err error, endpoint, kind string) error {
	var refused *agent.RefusedError
	var unreachable *agent.UnreachableError
	switch {
	case errors.Is(err, agent.ErrNeedsNewCode):
		return cli.Exit(cli.ExitRefused, err)
	case errors.Is(err, agent.ErrGaveUp):
		return cli.Exit(cli.ExitRefused, err)
	case errors.Is(err, agent.ErrNotAccepted):
		return cli.Exit(cli.ExitRefused, fmt.Errorf("%s not accepted, or the listener is not authentic; check the %s and the endpoint", kind, kind))
	case errors.Is(err, agent.ErrNotAuthentic):
		return cli.Exit(cli.ExitRefused, err)
	case errors.As(err, &refused):
		if refused.Retryable() {
			if refused.RetryAfter > 0 {
				return cli.Exit(cli.ExitTransient, fmt.Errorf("%s (retry in %s)", refused.Message, refused.RetryAfter))
			}
			return cli.Exit(cli.ExitTransient, fmt.Errorf("%s; try again later", refused.Message))
		}
		return cli.Exit(cli.ExitRefused, fmt.Errorf("join refused: %s", refused.Message))
	case errors.As(err, &unreachable):
		return cli.Exit(cli.ExitTransient, fmt.Errorf("%s: %w", endpoint, err))
	case errors.Is(err, fs.ErrPermission):
		return cli.Exit(cli.ExitUsage, fmt.Errorf("%w: run as root, or give --state a directory this user may write", err))
	}
	return err
}

// refusal is `join --json` when the join did not happen: the listener's
// code where it named one (JOIN_CODE_STALE, ...), the secret's kind, and
// the sentence the operator reads.
type refusal struct {
	Joined     bool   `json:"joined"`
	Code       string `json:"code"`
	Message    string `json:"message"`
	SecretKind string `json:"secretKind"`
	Retryable  bool   `json:"retryable"`
}

func refusalView(err, shown error, sec joincode.Secret) refusal {
	r := refusal{Message: shown.Error(), SecretKind: sec.Kind.String(), Code: "JOIN_FAILED"}
	var refused *agent.RefusedError
	var unreachable *agent.UnreachableError
	switch {
	case errors.As(err, &refused):
		r.Code, r.Retryable = refused.Code, refused.Retryable()
	case errors.Is(err, agent.ErrGaveUp):
		r.Code = "AGENT_GAVE_UP"
	case errors.Is(err, agent.ErrNotAccepted):
		r.Code = "PAKE_NOT_ACCEPTED"
	case errors.Is(err, agent.ErrNotAuthentic):
		r.Code = "LISTENER_NOT_AUTHENTIC"
	case errors.As(err, &unreachable):
		r.Code, r.Retryable = "LISTENER_UNREACHABLE", true
	}
	return r
}

func printJoined(w io.Writer, stateDir string, id agent.Identity) error {
	if jsonOut {
		return cli.PrintJSON(w, id)
	}
	fmt.Fprintf(w, "joined as %s (role %s, trust %s)\n", id.NodeID, id.Role, id.Trust)
	fmt.Fprintf(w, "pinned CA  %s\n", id.CAFingerprint)
	fmt.Fprintf(w, "certificate valid until %s, renewal after %s\n", id.NotAfter.Format(time.RFC3339), id.RenewAfter.Format(time.RFC3339))
	fmt.Fprintf(w, "identity in %s\n", stateDir)
	return nil
}

func hwidCommand() *cobra.Command {
	var hw hwidFlags
	cmd := &cobra.Command{
		Use:   "hwid [--root DIR]",
		Short: "print the hardware identity this machine would claim",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rep, err := hw.collect(cmd.Context(), nil)
			if err != nil {
				return err
			}
			if jsonOut {
				return cli.PrintJSON(cmd.OutOrStdout(), rep)
			}
			return rep.WriteText(cmd.OutOrStdout())
		},
	}
	hw.register(cmd)
	return cmd
}

func statusCommand() *cobra.Command {
	var stateDir string
	cmd := &cobra.Command{
		Use:   "status [--state DIR]",
		Short: "print this node's identity",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			id, ok, err := agent.State{Dir: stateDir}.Identity()
			if err != nil {
				return err
			}
			if !ok {
				p, pending, err := agent.State{Dir: stateDir}.Pending()
				if err != nil {
					return err
				}
				if jsonOut {
					v := map[string]any{"joined": false}
					if pending {
						v["pending"] = p
					}
					return cli.PrintJSON(cmd.OutOrStdout(), v)
				}
				if pending {
					fmt.Fprintf(cmd.OutOrStdout(), "not joined: join %s (with a %s) waits for approval; SAS %s\n", p.JoinID, p.Kind, p.SAS)
				} else {
					fmt.Fprintf(cmd.OutOrStdout(), "not joined (no identity in %s)\n", stateDir)
				}
				return cli.Exit(cli.ExitRefused, errors.New("not joined"))
			}
			if jsonOut {
				return cli.PrintJSON(cmd.OutOrStdout(), statusView{Joined: true, Identity: id})
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "node         %s\nrole         %s\ntrust        %s\nendpoint     %s\npinned CA    %s\ncert expires %s\n", id.NodeID, id.Role, id.Trust, id.Endpoint, id.CAFingerprint, id.NotAfter.Format(time.RFC3339))
			renewal, lastErr := "never", "none"
			if id.LastRenewal != nil {
				renewal = id.LastRenewal.Format(time.RFC3339)
			}
			if id.LastError != "" {
				lastErr = id.LastError
			}
			key := "file " + agent.KeyFile
			if id.TPM != "" {
				key = "in the TPM " + id.TPM
			}
			fmt.Fprintf(w, "node key     %s\n", key)
			fmt.Fprintf(w, "last renewal %s\nlast error   %s\n", renewal, lastErr)
			return nil
		},
	}
	cmd.Flags().StringVar(&stateDir, "state", "/var/lib/stratum-agent", "state directory")
	return cmd
}

// statusView is `status --json`: the identity, with whether there is one.
type statusView struct {
	Joined bool `json:"joined"`
	agent.Identity
}

func runCommand() *cobra.Command {
	var cfg agent.RunConfig
	var codeFile string
	var hw hwidFlags
	var tf tpmFlags
	var logLevel, metricsAddr string
	var endpoints []string
	cmd := &cobra.Command{
		Use:   "run [--state DIR] [--endpoint HOST:PORT] [--code-file F]",
		Short: "keep this machine joined: join if needed, then renew (the systemd service)",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var level slog.Level
			if err := level.UnmarshalText([]byte(logLevel)); err != nil {
				return usage("--log-level: %w", err)
			}
			cfg.Logger = slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
			eps := splitAll(endpoints)
			if id, ok, err := (agent.State{Dir: cfg.StateDir}).Identity(); err == nil && ok && len(eps) == 0 {
				eps = append([]string{id.Endpoint}, id.Endpoints...)
			}
			// the unit reads these from /etc/stratum/agent.env, written at provisioning
			if len(eps) == 0 {
				eps = agent.SplitEndpoints(os.Getenv("STRATUM_ENDPOINT"))
			}
			if len(eps) > 0 {
				cfg.Endpoint, cfg.Endpoints = eps[0], eps[1:]
			}
			if cfg.CAFingerprint == "" {
				cfg.CAFingerprint = os.Getenv("STRATUM_CA_FINGERPRINT")
			}
			if err := checkTargets(eps, cfg.CAFingerprint, "--endpoint (or STRATUM_ENDPOINT) is required until the node has joined"); err != nil {
				return err
			}
			cfg.Endpoint, cfg.Endpoints = eps[0], eps[1:]
			// no core dump or ptrace peer may see the code or the node key
			if err := agent.ProtectSecrets(); err != nil {
				return err
			}
			var err error
			if cfg.TPM, err = tf.locator(cfg.StateDir, cfg.Logger); err != nil {
				return err
			}
			cfg.Secret = func() (joincode.Secret, error) { return readSecret(cmd, "", codeFile) }
			cfg.Facts = func(ctx context.Context) (wire.Facts, error) {
				rep, err := hw.collect(ctx, cfg.Logger)
				return rep.Facts, err
			}
			n := systemd.NewNotifier(cfg.Logger)
			cfg.Notifier = n
			// The service loop itself pings, so a stuck loop is restarted.
			if iv, err := systemd.WatchdogInterval(); err == nil && iv > 0 {
				cfg.WatchdogInterval = iv
				cfg.Watchdog = func() {
					if err := n.Watchdog(); err != nil {
						cfg.Logger.Warn("systemd watchdog ping failed", "err", err)
					}
				}
			}
			if metricsAddr != "" {
				ln, err := listenMetrics(metricsAddr)
				if err != nil {
					return usage("--metrics: %w", err)
				}
				m := agent.NewMetrics(cfg.StateDir)
				cfg.OnRetry, cfg.OnRenewal = m.Retried, m.Renewed
				go m.Serve(cmd.Context(), ln, cfg.Logger)
			}
			err = agent.Run(cmd.Context(), cfg)
			_ = n.Stopping()
			if err != nil {
				return explain(err, cfg.Endpoint)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&cfg.StateDir, "state", "/var/lib/stratum-agent", "state directory (0700)")
	cmd.Flags().StringArrayVar(&endpoints, "endpoint", nil, "a join listener, host:port, repeatable (remembered after joining; STRATUM_ENDPOINT takes a comma or space separated list)")
	cmd.Flags().StringVar(&codeFile, "code-file", "", "join code file (default: the systemd credential join-code)")
	cmd.Flags().StringVar(&cfg.CAFingerprint, "ca-fingerprint", "", "SHA-256 of the cluster root CA to insist on")
	cmd.Flags().StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	cmd.Flags().StringVar(&metricsAddr, "metrics", "", "serve Prometheus /metrics on this TCP address; a port alone means 127.0.0.1 (default: off)")
	hw.register(cmd)
	tf.register(cmd)
	return cmd
}

// listenMetrics listens on addr; a port alone ("9447" or ":9447") is
// loopback only: the agent's metrics are for a local scraper.
func listenMetrics(addr string) (net.Listener, error) {
	if !strings.Contains(addr, ":") {
		addr = ":" + addr
	}
	if strings.HasPrefix(addr, ":") {
		addr = "127.0.0.1" + addr
	}
	return net.Listen("tcp", addr)
}

func renewCommand() *cobra.Command {
	var stateDir string
	var now bool
	cmd := &cobra.Command{
		Use:   "renew --now [--state DIR]",
		Short: "renew this node's certificate now, not at the service's next renewal time",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !now {
				return usage("renew needs --now (the service renews on its own at 2/3 of the certificate's life)")
			}
			id, err := agent.Renew(cmd.Context(), agent.RenewConfig{StateDir: stateDir})
			if err != nil {
				if errors.Is(err, fs.ErrPermission) {
					return explain(err, id.Endpoint)
				}
				var refused *agent.RefusedError
				if errors.As(err, &refused) && !refused.Retryable() {
					return cli.Exit(cli.ExitRefused, fmt.Errorf("renewal refused: %s: join again with a new code", refused.Message))
				}
				return explain(err, id.Endpoint)
			}
			if jsonOut {
				return cli.PrintJSON(cmd.OutOrStdout(), id)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "renewed %s: certificate valid until %s\n", id.NodeID, id.NotAfter.Format(time.RFC3339))
			return nil
		},
	}
	cmd.Flags().BoolVar(&now, "now", false, "renew now")
	cmd.Flags().StringVar(&stateDir, "state", "/var/lib/stratum-agent", "state directory")
	return cmd
}

func leaveCommand() *cobra.Command {
	var stateDir string
	cmd := &cobra.Command{
		Use:   "leave [--state DIR]",
		Short: "leave the cluster: revoke this node's certificate at the listener, then wipe the state directory",
		Long: `leave asks the listener, over mutual TLS under this node's certificate, to
revoke the node (as "stratum-listener nodes revoke" would), and once it has,
removes the node's key (or its TPM blobs), certificate, ca.pem and node.json.
Stop the service first (systemctl stop stratum-agent), or it tries to join again.
Exit status: 0 left, 1 refused (nothing wiped), 3 unreachable (nothing wiped).`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			id, err := agent.Leave(cmd.Context(), agent.RenewConfig{StateDir: stateDir})
			if err != nil {
				var refused *agent.RefusedError
				if errors.As(err, &refused) && !refused.Retryable() {
					return cli.Exit(cli.ExitRefused, fmt.Errorf("leave refused: %s (%s); the state directory was left as it was", refused.Message, refused.Code))
				}
				var unreachable *agent.UnreachableError
				if errors.As(err, &unreachable) {
					return fmt.Errorf("%w; the state directory was left as it was", explain(err, id.Endpoint))
				}
				return explain(err, id.Endpoint)
			}
			if jsonOut {
				return cli.PrintJSON(cmd.OutOrStdout(), map[string]string{"nodeId": id.NodeID, "status": "left", "stateDir": stateDir})
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s left the cluster: its certificate is revoked and %s is wiped\n", id.NodeID, stateDir)
			return nil
		},
	}
	cmd.Flags().StringVar(&stateDir, "state", "/var/lib/stratum-agent", "state directory")
	return cmd
}

// splitAll flattens repeated flags that may each hold a comma list.
func splitAll(vals []string) []string {
	var out []string
	for _, v := range vals {
		out = append(out, agent.SplitEndpoints(v)...)
	}
	return out
}
