package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/stratumjoin/stratum/agent"
	"github.com/stratumjoin/stratum/hwid"
	"github.com/stratumjoin/stratum/internal/joincode"
	"github.com/stratumjoin/stratum/internal/wire"
	"github.com/stratumjoin/stratum/systemd"
)

// exitError carries an exit status.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func usage(format string, a ...any) error {
	return &exitError{2, fmt.Errorf(format, a...)}
}

func exitCode(err error) int {
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	var unreachable *agent.UnreachableError
	if errors.As(err, &unreachable) {
		return 3
	}
	var refused *agent.RefusedError
	if errors.As(err, &refused) && refused.Retryable() {
		return 3
	}
	return 1
}

var jsonOut bool

func rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "stratum-agent",
		Short:         "Stratum Join agent: joins this machine to a cluster with a join code",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &exitError{2, err} })
	root.PersistentFlags().BoolVar(&jsonOut, "json", false, "print JSON")
	root.AddCommand(joinCommand(), runCommand(), hwidCommand(), statusCommand(), tpmCommand())
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
			if len(eps) == 0 {
				return usage("--endpoint (or STRATUM_ENDPOINT) is required")
			}
			cfg.Endpoint, cfg.Endpoints = eps[0], eps[1:]
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
				shown := explainKind(err, sec.Kind.String())
				if jsonOut {
					_ = printJSON(cmd.OutOrStdout(), refusalView(err, shown, sec))
				}
				return shown
			}
			return printJoined(cmd.OutOrStdout(), cfg.StateDir, j.Identity)
		},
	}
	cmd.Flags().StringArrayVar(&endpoints, "endpoint", nil, "a join listener, host:port; repeat it (or separate by commas) for every listener of the cluster: the agent fails over to the next when one is down")
	cmd.Flags().StringVar(&code, "code", "", "the join code; - reads it from stdin (on the command line, ps shows it)")
	cmd.Flags().StringVar(&codeFile, "code-file", "", "read the join code from this file")
	cmd.Flags().StringVar(&cfg.StateDir, "state", "/var/lib/stratum-agent", "state directory (0700)")
	cmd.Flags().StringVar(&cfg.CAFingerprint, "ca-fingerprint", "", "SHA-256 of the cluster root CA; the join fails if the listener proves another")
	cmd.Flags().BoolVar(&verbose, "verbose", false, "log debug detail to stderr (never the code)")
	hw.register(cmd)
	tf.register(cmd)
	return cmd
}

// explain turns an error into the sentence the operator reads.
func explain(err error) error { return explainKind(err, "join code") }

// explainKind is explain for a secret of the named kind (join code, join
// token, join key), which the sentence names.
func explainKind(err error, kind string) error {
	var refused *agent.RefusedError
	var unreachable *agent.UnreachableError
	switch {
	case errors.Is(err, agent.ErrNeedsNewCode):
		return &exitError{1, err}
	case errors.Is(err, agent.ErrGaveUp):
		return &exitError{1, err}
	case errors.Is(err, agent.ErrNotAccepted):
		return &exitError{1, fmt.Errorf("%s not accepted, or the listener is not authentic; check the %s and the endpoint", kind, kind)}
	case errors.Is(err, agent.ErrNotAuthentic):
		return &exitError{1, err}
	case errors.As(err, &refused):
		if refused.Retryable() {
			return &exitError{3, fmt.Errorf("the listener is busy: %s", refused.Message)}
		}
		return &exitError{1, fmt.Errorf("join refused: %s", refused.Message)}
	case errors.As(err, &unreachable):
		return &exitError{3, err}
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

// printJSON is every --json output: indented, one value.
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func printJoined(w io.Writer, stateDir string, id agent.Identity) error {
	if jsonOut {
		return printJSON(w, id)
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
				return printJSON(cmd.OutOrStdout(), rep)
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
					return printJSON(cmd.OutOrStdout(), v)
				}
				if pending {
					fmt.Fprintf(cmd.OutOrStdout(), "not joined: join %s (with a %s) waits for approval; SAS %s\n", p.JoinID, p.Kind, p.SAS)
				} else {
					fmt.Fprintf(cmd.OutOrStdout(), "not joined (no identity in %s)\n", stateDir)
				}
				return &exitError{1, errors.New("not joined")}
			}
			if jsonOut {
				return printJSON(cmd.OutOrStdout(), statusView{Joined: true, Identity: id})
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
	var logLevel string
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
			if cfg.Endpoint == "" {
				return usage("--endpoint (or STRATUM_ENDPOINT) is required until the node has joined")
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
			if iv, err := systemd.WatchdogInterval(); err == nil && iv > 0 {
				go n.RunWatchdog(cmd.Context(), iv)
			}
			err = agent.Run(cmd.Context(), cfg)
			_ = n.Stopping()
			if err != nil {
				return explain(err)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&cfg.StateDir, "state", "/var/lib/stratum-agent", "state directory (0700)")
	cmd.Flags().StringArrayVar(&endpoints, "endpoint", nil, "a join listener, host:port, repeatable (remembered after joining; STRATUM_ENDPOINT takes a comma or space separated list)")
	cmd.Flags().StringVar(&codeFile, "code-file", "", "join code file (default: the systemd credential join-code)")
	cmd.Flags().StringVar(&cfg.CAFingerprint, "ca-fingerprint", "", "SHA-256 of the cluster root CA to insist on")
	cmd.Flags().StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	hw.register(cmd)
	tf.register(cmd)
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
