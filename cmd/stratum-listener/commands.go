package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/stratumjoin/stratum/internal/cli"
	"github.com/stratumjoin/stratum/internal/cluster"
	"github.com/stratumjoin/stratum/internal/gcfloor"
	"github.com/stratumjoin/stratum/internal/pake"
	_ "github.com/stratumjoin/stratum/internal/store/boltstore" // bolt: store
	_ "github.com/stratumjoin/stratum/internal/store/etcdstore" // etcd:// store
	"github.com/stratumjoin/stratum/internal/tpm"
	"github.com/stratumjoin/stratum/internal/wire"
	"github.com/stratumjoin/stratum/listener"
	"github.com/stratumjoin/stratum/listener/adminapi"
	"github.com/stratumjoin/stratum/listener/adminclient"
	"github.com/stratumjoin/stratum/listener/registry"
	"github.com/stratumjoin/stratum/pki"
	"github.com/stratumjoin/stratum/systemd"
)

var (
	jsonOut     bool
	adminSocket string
)

func rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "stratum-listener",
		Short:         "Stratum Join listener: joins machines to the cluster with short codes proven by OPAQUE over QUIC",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return cli.Usage(err) })
	root.PersistentFlags().BoolVar(&jsonOut, "json", false, "print JSON")
	root.PersistentFlags().DurationVar(&adminTimeout, "timeout", 30*time.Second, "how long an admin command waits for the listener's answer")
	root.PersistentFlags().StringVar(&adminSocket, "admin-socket", adminclient.SocketFromEnv(), "the listener's admin unix socket (or set STRATUM_ADMIN_SOCKET)")
	root.AddCommand(initCommand(), serveCommand(), codesCommand(), storeCommand(), joinsCommand(), nodesCommand(), caCommand(), eventsCommand(), apikeysCommand(), registryCommand())
	// every flag also from STRATUM_<FLAG> (the unit's listener.env)
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		return cli.FlagsFromEnv(cmd, func(err error) error { return cli.Usage(err) })
	}
	cli.AddVersion(root, &jsonOut)
	cli.AddDocs(root)
	cli.RequireSubcommands(root, func(err error) error { return cli.Usage(err) })
	return root
}

func args(n int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, a []string) error {
		if len(a) != n {
			return cli.Usage(fmt.Errorf("%s takes %d argument(s)", cmd.CommandPath(), n))
		}
		return nil
	}
}

// adminTimeout bounds each admin request (--timeout).
var adminTimeout time.Duration

func client() *adminclient.Client { return adminclient.New(adminSocket).WithTimeout(adminTimeout) }

func initCommand() *cobra.Command {
	var cfg listener.InitConfig
	var caCert, caKey, storeFlag string
	var light bool
	var codeKSF string
	var etcd etcdFlags
	cmd := &cobra.Command{
		Use:   "init --data DIR [--store URL [--join --kek FILE]]",
		Short: "create the CA, the listener certificate and the OPAQUE keys in DIR, or join the cluster in --store",
		Args:  args(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cfg.DataDir == "" {
				return cli.Usage(fmt.Errorf("--data is required"))
			}
			for _, ep := range cfg.Endpoints {
				if _, err := wire.Endpoint(ep); err != nil {
					return cli.Usage(fmt.Errorf("--endpoint: %w", err))
				}
			}
			if cfg.Join && (caCert != "" || light || codeKSF != "" || cmd.Flags().Changed("node-lifetime")) {
				return cli.Usage(fmt.Errorf("--join takes the cluster's CA and settings: --ca-cert, --light-ksf, --code-ksf and --node-lifetime do not apply"))
			}
			if cfg.Join && !cmd.Flags().Changed("trust-domain") {
				cfg.TrustDomain = ""
			}
			if storeFlag != "" {
				var err error
				if cfg.StoreURL, err = etcd.storeURL(storeFlag); err != nil {
					return err
				}
			}
			if (caCert == "") != (caKey == "") {
				return cli.Usage(fmt.Errorf("--ca-cert and --ca-key go together"))
			}
			if caCert != "" {
				var err error
				if cfg.CACertPEM, err = os.ReadFile(caCert); err != nil {
					return err
				}
				if cfg.CAKeyPEM, err = os.ReadFile(caKey); err != nil {
					return err
				}
			}
			if light && codeKSF != "" {
				return cli.Usage(fmt.Errorf("--light-ksf and --code-ksf go alone"))
			}
			if light {
				cfg.KSF = pake.LightestKSF
			}
			if codeKSF != "" {
				p, err := parseKSF(codeKSF)
				if err != nil {
					return cli.Usage(fmt.Errorf("--code-ksf: %w", err))
				}
				cfg.KSF = p
			}
			ca, err := listener.Init(cmd.Context(), cfg)
			var exists *listener.ClusterExistsError
			if errors.As(err, &exists) {
				ep := strings.Join(cfg.Endpoints, " --endpoint ")
				if ep == "" {
					ep = "HOST:PORT"
				}
				return fmt.Errorf("%w\nrefusing to make a second cluster in one store. To add this machine as one more listener of it, copy keys/%s from one of its listeners here (0600) as FILE and run:\n\n  stratum-listener init --join --kek FILE --store %s%s --data %s --endpoint %s", err, listener.KEKFile, storeFlag, etcd.args(), cfg.DataDir, ep)
			}
			if err != nil {
				return err
			}
			fp := ca.Fingerprint()
			out := map[string]string{"dataDir": cfg.DataDir, "caFingerprint": pki.FormatFingerprint(fp), "subject": ca.Cert().Subject.String()}
			if jsonOut {
				return cli.PrintJSON(cmd.OutOrStdout(), out)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "initialized %s\nCA %s\nCA fingerprint (SHA-256) %s\n", cfg.DataDir, out["subject"], out["caFingerprint"])
			return nil
		},
	}
	cmd.Flags().StringVar(&cfg.DataDir, "data", "", "data directory (created 0700)")
	cmd.Flags().StringVar(&cfg.TrustDomain, "trust-domain", "stratum.local", "SPIFFE trust domain of node identities")
	cmd.Flags().StringSliceVar(&cfg.Endpoints, "endpoint", nil, "host[:port] agents dial, port 9444 unless given (repeatable; default 127.0.0.1:9444)")
	cmd.Flags().StringVar(&caCert, "ca-cert", "", "import this CA certificate chain (PEM, CA first, root last) instead of creating a root")
	cmd.Flags().StringVar(&caKey, "ca-key", "", "the imported CA's private key (PEM)")
	cmd.Flags().BoolVar(&light, "light-ksf", false, "stretch join codes with the lightest Argon2id parameters accepted (t=1, 8 MiB, 1 lane; the default)")
	cmd.Flags().StringVar(&codeKSF, "code-ksf", "", "stretch join codes with these Argon2id parameters instead: TIME,MEMORY_KIB,THREADS (default 1,8192,1; docs/secrets.md sizes them)")
	cmd.Flags().DurationVar(&cfg.NodeLifetime, "node-lifetime", 0, "node certificate lifetime (default 168h)")
	cmd.Flags().StringVar(&storeFlag, "store", os.Getenv("STRATUM_STORE"), "the store several listeners share (etcd://host:2379,... or etcds://...): seal this cluster's keys into it ($STRATUM_STORE)")
	cmd.Flags().BoolVar(&cfg.Join, "join", false, "add this listener to the cluster already in --store, with its key-encryption key (--kek)")
	cmd.Flags().StringVar(&cfg.KEKFile, "kek", "", "with --join: the cluster's key-encryption key, copied from keys/"+listener.KEKFile+" of one of its listeners")
	etcd.register(cmd.Flags())
	return cmd
}

func serveCommand() *cobra.Command {
	var cfg listener.Config
	var logLevel, registryFile, tpmCADir string
	var etcd etcdFlags
	cmd := &cobra.Command{
		Use:   "serve --data DIR",
		Short: "serve joins, renewals and the admin socket",
		Args:  args(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cfg.DataDir == "" {
				return cli.Usage(fmt.Errorf("--data is required"))
			}
			var level slog.Level
			if err := level.UnmarshalText([]byte(logLevel)); err != nil {
				return cli.Usage(fmt.Errorf("--log-level (or STRATUM_LOG_LEVEL): %w", err))
			}
			cfg.Logger = slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
			cfg.AdminSocket = adminSocket
			if registryFile != "" {
				reg, err := registry.Load(registryFile)
				if err != nil {
					return err
				}
				cfg.Registry = reg
				cfg.Logger.Info("registry loaded", "file", registryFile, "contents", reg.Summary())
			}
			if tpmCADir != "" {
				roots, err := tpm.LoadCADir(tpmCADir)
				if err != nil {
					return err
				}
				cfg.TPMRoots = roots
				cfg.Logger.Info("TPM manufacturer certificates loaded", "dir", tpmCADir, "certificates", len(roots))
			} else if cfg.Registry != nil {
				for _, p := range cfg.Registry.Pools {
					if p.Policy.RequireTPM {
						cfg.Logger.Warn("pool requires TPM attestation, but without --tpm-ca-dir an EK is not checked against a manufacturer: any key that answers the credential passes", "pool", p.ID)
					}
				}
			}
			act, err := systemd.Activation()
			if err != nil {
				return err
			}
			if pc, ok := act.PacketConns["quic"]; ok {
				cfg.PacketConn = pc
			}
			if ln, ok := act.Listeners["admin"]; ok {
				cfg.AdminListener = ln
			}
			if ln, ok := act.Listeners["https"]; ok {
				cfg.HTTPSListener = ln
			}
			notifier := systemd.NewNotifier(cfg.Logger)
			cfg.Ready = func(addr net.Addr) {
				_ = notifier.Ready("serving joins on " + addr.String())
			}
			if cfg.StoreURL, err = etcd.storeURL(cfg.StoreURL); err != nil {
				return err
			}
			l, err := listener.New(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			if iv, _ := systemd.WatchdogInterval(); iv > 0 {
				go notifier.RunWatchdog(cmd.Context(), iv)
			}
			err = l.Run(cmd.Context())
			_ = notifier.Stopping()
			return err
		},
	}
	cmd.Flags().StringVar(&cfg.DataDir, "data", "", "data directory made by init")
	cmd.Flags().StringVar(&cfg.Listen, "listen", ":9444", "UDP address for QUIC (unless socket-activated)")
	cmd.Flags().StringVar(&cfg.StoreURL, "store", os.Getenv("STRATUM_STORE"), "store URL: bolt:/path/state.db (default, in DIR) or etcd://host:2379,host2:2379 or etcds://... ($STRATUM_STORE)")
	etcd.register(cmd.Flags())
	cmd.Flags().StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	cmd.Flags().IntVar(&cfg.MaxConnections, "max-connections", 2048, "join connections served at once; agents beyond it back off and retry")
	cmd.Flags().IntVar(&cfg.MaxHandshakes, "max-handshakes", 0, "QUIC handshakes in progress at once; past it new connections wait in the backlog (-1: no bound; default 256 per CPU)")
	cmd.Flags().IntVar(&cfg.MaxActive, "max-active", 0, "connections at work at once (handshakes, joins and renewals, but not joins waiting for an approval or connections waiting on their peer past a second); past it new connections wait in the backlog, first come first served (-1: no bound; default 128 per CPU)")
	cmd.Flags().IntVar(&cfg.Backlog, "backlog", 0, "new connections that may wait for room under --max-active and --max-handshakes, each up to 25s; past it their first packets are dropped and agents send them again (default 16384)")
	cmd.Flags().IntVar(&cfg.GCHeadroomMiB, "gc-headroom", gcfloor.DefaultHeadroom>>20, "MiB the heap may grow between garbage collections while the live heap is smaller (0: GOGC's doubling alone; GOGC or GOMEMLIMIT in the environment override it)")
	cmd.Flags().IntVar(&cfg.MaxRenewals, "max-renewals", 512, "renewal connections served at once, apart from joins")
	cmd.Flags().IntVar(&cfg.PerSourceConnections, "connections-per-source", 64, "connections one source address may hold at once (-1: no share)")
	cmd.Flags().DurationVar(&cfg.FirstStream, "first-stream", 5*time.Second, "how long a connection may go without opening its stream")
	cmd.Flags().IntVar(&cfg.UnprovenPerSource, "unproven-per-source", 8, "unproven join starts one address may make in any --budget-window (-1: no budget)")
	cmd.Flags().IntVar(&cfg.UnprovenPerPrefix, "unproven-per-prefix", 32, "unproven join starts one /24 (IPv4) or /64 (IPv6) may make in any --budget-window")
	cmd.Flags().DurationVar(&cfg.BudgetWindow, "budget-window", 10*time.Minute, "the window of the per-source budget of unproven starts")
	cmd.Flags().DurationVar(&cfg.BudgetWait, "budget-wait", 10*time.Second, "how long a start over its source's budget waits for a proven start of that source to give its charge back")
	cmd.Flags().DurationVar(&cfg.RenewGrace, "renew-grace", 96*time.Hour, "how long after expiry a node certificate still renews; later the node needs a new code")
	cmd.Flags().Float64Var(&cfg.RetryAbove, "retry-above", 20, "new connections per second from one source above which it must answer a QUIC Retry (raise it for agents behind one NAT)")
	cmd.Flags().StringVar(&registryFile, "registry", "", "registry file (YAML or JSON): tenants, sites, pools, networks, roles (default: one tenant, site and pool named default)")
	cmd.Flags().DurationVar(&cfg.StoreTimeout, "store-timeout", listener.DefaultStoreTimeout, "deadline of each store call: past it agents are told JOIN_UNAVAILABLE and the admin API answers 503")
	cmd.Flags().StringVar(&cfg.HTTPSListen, "https", "", "serve the admin API over HTTPS with bearer API keys on this TCP address (default: off)")
	cmd.Flags().StringSliceVar(&cfg.HTTPSNames, "https-name", nil, "another DNS name or IP address for the HTTPS admin certificate (repeatable; the join endpoints' names are always in it)")
	cmd.Flags().StringVar(&cfg.MetricsListen, "metrics", "", "serve Prometheus /metrics, /healthz and /readyz over HTTP on this TCP address, e.g. 127.0.0.1:9446 (default: off)")
	cmd.Flags().StringVar(&tpmCADir, "tpm-ca-dir", "", "TPM manufacturer root and intermediate certificates (PEM or DER files); with it, a TPM attestation passes only with an EK certificate that chains to them")
	return cmd
}

func codesCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "codes", Short: "mint, list, show and revoke join codes"}
	var req adminapi.MintCodeRequest
	var ttl time.Duration
	var maxUses int
	var expect cluster.Expect
	var createLabels []string
	create := &cobra.Command{
		Use:   "create",
		Short: "mint a join code; it is printed once",
		Args:  args(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			req.TTLSeconds = int(ttl / time.Second)
			req.MaxUses = &maxUses
			if expect != (cluster.Expect{}) {
				req.Expect = &expect
			}
			labels, err := parseLabels(createLabels)
			if err != nil {
				return err
			}
			req.Labels = labels
			c, err := client().MintCode(cmd.Context(), req)
			if err != nil {
				return inFlagTerms(err, codeFlags)
			}
			if jsonOut {
				return cli.PrintJSON(cmd.OutOrStdout(), c)
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "join code  %s\n", c.Code)
			fmt.Fprintf(w, "id         %s\nexpires    %s\nmax uses   %s\npool       %s (role %s, trust %s)\n", c.ID, c.ExpiresAt.Format(time.RFC3339), usesText(c.MaxUses), c.Pool, c.Role, c.Trust)
			if len(c.Endpoints) > 1 {
				fmt.Fprintf(w, "endpoints  %s\n", strings.Join(c.Endpoints, " "))
			}
			if c.Description != "" {
				fmt.Fprintf(w, "description %s\n", c.Description)
			}
			if len(c.Labels) > 0 {
				fmt.Fprintf(w, "labels     %s\n", labelsText(c.Labels))
			}
			if c.RequireApproval {
				fmt.Fprintln(w, "approval   required: compare the 6-digit SAS each machine prints, then `stratum-listener joins approve ID --sas DIGITS`")
			}
			fmt.Fprintf(w, "\nThe code is shown only this once. On the machine, run:\n\n  %s\n\nand type the code when asked (or pipe it in; never put it on the command line).\n", c.AgentCommand)
			return nil
		},
	}
	create.Flags().DurationVar(&ttl, "ttl", time.Hour, "how long the code stays valid")
	create.Flags().IntVar(&maxUses, "max-uses", 0, "how many machines may join with it (0 = every machine of the batch until it expires)")
	create.Flags().StringVar(&req.Pool, "pool", "default", "pool the machines join")
	create.Flags().BoolVar(&req.AutoApprove, "auto-approve", false, "join machines without an admin's approval (the code alone is then the gate)")
	var requireApproval bool
	create.Flags().BoolVar(&requireApproval, "require-approval", true, "hold each join until an admin approves it (the default; see --auto-approve)")
	_ = create.Flags().MarkHidden("require-approval")
	create.Flags().StringVar(&expect.ProductUUID, "expect-product-uuid", "", "pin to this SMBIOS product UUID")
	create.Flags().StringVar(&expect.Serial, "expect-serial", "", "pin to this system serial")
	create.Flags().StringVar(&expect.MAC, "expect-mac", "", "pin to a machine with this NIC MAC")
	create.Flags().StringVar(&expect.GPUUUID, "expect-gpu-uuid", "", "pin to a machine with this NVIDIA GPU UUID")
	create.Flags().StringVar(&expect.EKHash, "expect-ek", "", "pin to the TPM with this endorsement key SHA-256 (stratum-agent tpm ek prints it); attested, not claimed")
	create.Flags().BoolVar(&req.AllowReclaim, "allow-reclaim", false, "let a machine that is already joined join again, keeping its node id")
	create.Flags().StringVar(&req.Hosted, "hosted", "", "kubernetes: the agent runs as a DaemonSet (tenant-controlled trust)")
	create.Flags().StringVar(&req.Description, "description", "", "a note for operators (at most 256 characters), shown by codes list and show")
	create.Flags().StringArrayVar(&createLabels, "label", nil, "a KEY=VALUE label (repeatable, at most 16); codes list --label filters by it")

	var all bool
	var listLabels []string
	list := &cobra.Command{
		Use: "list", Short: "list join codes (live ones unless --all)", Args: args(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if _, err := parseLabels(listLabels); err != nil {
				return err
			}
			codes, err := client().Codes(cmd.Context(), listLabels...)
			if err != nil {
				return inFlagTerms(err, codeFlags)
			}
			if !all {
				live := codes[:0]
				for _, c := range codes {
					if c.State == "live" {
						live = append(live, c)
					}
				}
				codes = live
			}
			if jsonOut {
				return cli.PrintJSON(cmd.OutOrStdout(), map[string]any{"items": codes})
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 2, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tSELECTOR\tSTATE\tUSES\tFAILED\tPOOL\tEXPIRES\tLABELS\tDESCRIPTION")
			for _, c := range codes {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d/%s\t%d\t%s\t%s\t%s\t%s\n", c.ID, c.Selector, c.State, c.Uses, usesText(c.MaxUses), c.FailedAttempts, c.Pool, relTime(c.ExpiresAt, time.Now()), orDash(labelsText(c.Labels)), orDash(c.Description))
			}
			return tw.Flush()
		},
	}
	list.Flags().BoolVar(&all, "all", false, "include expired and revoked codes")
	list.Flags().StringArrayVar(&listLabels, "label", nil, "only codes with this KEY=VALUE label (repeatable: all must match)")
	show := &cobra.Command{
		Use: "show ID", Short: "show one join code", Args: args(1),
		RunE: func(cmd *cobra.Command, a []string) error {
			c, err := client().Code(cmd.Context(), a[0])
			if err != nil {
				return err
			}
			return cli.PrintJSON(cmd.OutOrStdout(), c)
		},
	}
	revoke := &cobra.Command{
		Use: "revoke ID", Short: "revoke a join code at once", Args: args(1),
		RunE: func(cmd *cobra.Command, a []string) error {
			c, err := client().RevokeCode(cmd.Context(), a[0])
			if err != nil {
				return err
			}
			if jsonOut {
				return cli.PrintJSON(cmd.OutOrStdout(), c)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "revoked %s at %s by %s\n", c.ID, c.RevokedAt.Format(time.RFC3339), c.RevokedBy)
			return nil
		},
	}
	reset := &cobra.Command{
		Use: "reset-attempts ID", Short: "forget a live join code's failed attempts (recorded as an event)", Args: args(1),
		RunE: func(cmd *cobra.Command, a []string) error {
			c, err := client().ResetAttempts(cmd.Context(), a[0])
			if err != nil {
				return err
			}
			if jsonOut {
				return cli.PrintJSON(cmd.OutOrStdout(), c)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: failed attempts now %d\n", c.ID, c.FailedAttempts)
			return nil
		},
	}
	cmd.AddCommand(create, list, show, revoke, reset)
	return cmd
}

func usesText(n int) string {
	if n == 0 {
		return "unlimited"
	}
	return fmt.Sprint(n)
}

func joinsCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "joins", Short: "list, show, approve and refuse joins held for approval"}
	list := &cobra.Command{
		Use: "list", Short: "list joins, pending first, with the SAS each agent prints", Args: args(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			js, err := client().Joins(cmd.Context())
			if err != nil {
				return err
			}
			if jsonOut {
				return cli.PrintJSON(cmd.OutOrStdout(), map[string]any{"items": js})
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 2, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tSTATE\tSAS\tCODE\tKEY SHA-256\tCLAIMED UUID\tCLAIMED HOSTNAME\tNODE")
			for _, j := range js {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", j.ID, j.State, orDash(j.SAS), j.SecretID, j.KeyFP[:16]+"…", j.Facts.ProductUUID, j.Facts.Hostname, j.NodeID)
			}
			return tw.Flush()
		},
	}
	show := &cobra.Command{
		Use: "show ID", Short: "show one join and its SAS", Args: args(1),
		RunE: func(cmd *cobra.Command, a []string) error {
			j, err := client().Join(cmd.Context(), a[0])
			if err != nil {
				return err
			}
			if jsonOut {
				return cli.PrintJSON(cmd.OutOrStdout(), j)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "join       %s\nstate      %s\nsas        %s\ncode       %s\nkey        %s\nclaimed    uuid %s, hostname %s\nnode       %s\n",
				j.ID, j.State, orDash(j.SAS), j.SecretID, j.KeyFP, j.Facts.ProductUUID, j.Facts.Hostname, orDash(j.NodeID))
			return nil
		},
	}
	decide := func(approve bool, use, short string) *cobra.Command {
		var sas string
		c := &cobra.Command{
			Use: use, Short: short, Args: args(1),
			RunE: func(cmd *cobra.Command, a []string) error {
				j, err := client().DecideJoin(cmd.Context(), a[0], approve, sas)
				if err != nil {
					return err
				}
				if jsonOut {
					return cli.PrintJSON(cmd.OutOrStdout(), j)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "join %s %s\n", j.ID, j.State)
				return nil
			},
		}
		if approve {
			c.Flags().StringVar(&sas, "sas", "", "the 6 digits the machine's agent prints; the approval is refused if they are not this join's")
		}
		return c
	}
	cmd.AddCommand(list, show, decide(true, "approve ID [--sas DIGITS]", "approve a pending join"), decide(false, "refuse ID", "refuse a pending join"))
	return cmd
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func nodesCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "nodes", Short: "list, show and revoke nodes"}
	var state, pool, role string
	list := &cobra.Command{
		Use: "list [--state S] [--pool P] [--role R]", Short: "list nodes", Args: args(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			all, err := client().Nodes(cmd.Context())
			if err != nil {
				return err
			}
			ns := all[:0]
			for _, n := range all {
				if (state == "" || n.State == state) && (pool == "" || n.Pool == pool) && (role == "" || n.Role == role) {
					ns = append(ns, n)
				}
			}
			if jsonOut {
				return cli.PrintJSON(cmd.OutOrStdout(), map[string]any{"items": ns})
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 2, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tSTATE\tROLE\tTRUST\tPOOL\tCLAIMED HOSTNAME\tCERT UNTIL")
			for _, n := range ns {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", n.ID, n.State, n.Role, n.Trust, n.Pool, n.Facts.Hostname, relTime(n.NotAfter, time.Now()))
			}
			return tw.Flush()
		},
	}
	list.Flags().StringVar(&state, "state", "", "only nodes in this state (active, revoked)")
	list.Flags().StringVar(&pool, "pool", "", "only nodes of this pool")
	list.Flags().StringVar(&role, "role", "", "only nodes with this role")
	show := &cobra.Command{
		Use: "show ID", Short: "show a node and the facts it claimed", Args: args(1),
		RunE: func(cmd *cobra.Command, a []string) error {
			n, err := client().Node(cmd.Context(), a[0])
			if err != nil {
				return err
			}
			if jsonOut {
				return cli.PrintJSON(cmd.OutOrStdout(), n)
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "node     %s (%s)\nrole     %s\ntrust    %s\npool     %s\njoined   %s with %s\ncert     serial %s until %s\n", n.ID, n.State, n.Role, n.Trust, n.Pool, n.JoinedAt.Format(time.RFC3339), n.SecretID, n.CertSerial, n.NotAfter.Format(time.RFC3339))
			if a := n.Attested; a != nil {
				chain := "EK certificate not checked (the listener has no --tpm-ca-dir)"
				if a.EKCertVerified {
					chain = "EK certificate verified, issued by " + a.EKIssuer
				}
				fmt.Fprintf(w, "attested by its TPM: the node key lives in the TPM\n  %-13s %s\n  %-13s %s\n", "ek sha-256", a.EKHash, "ek chain", chain)
			} else {
				fmt.Fprintln(w, "attested nothing (no TPM)")
			}
			fmt.Fprintln(w, "facts    claimed by the machine at join, not attested:")
			f := n.Facts
			for _, kv := range [][2]string{{"product uuid", f.ProductUUID}, {"serial", f.Serial}, {"board serial", f.BoardSerial}, {"vendor", f.Vendor}, {"product", f.ProductName}, {"hostname", f.Hostname}, {"macs", strings.Join(f.MACs, " ")}, {"gpus", strings.Join(f.GPUUUIDs, " ")}} {
				if kv[1] != "" {
					fmt.Fprintf(w, "  %-13s %s\n", kv[0], kv[1])
				}
			}
			return nil
		},
	}
	revoke := &cobra.Command{
		Use: "revoke ID", Short: "revoke a node: its renewals are refused", Args: args(1),
		RunE: func(cmd *cobra.Command, a []string) error {
			n, err := client().RevokeNode(cmd.Context(), a[0])
			if err != nil {
				return err
			}
			if jsonOut {
				return cli.PrintJSON(cmd.OutOrStdout(), n)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "revoked node %s\n", n.ID)
			return nil
		},
	}
	cmd.AddCommand(list, show, revoke)
	return cmd
}

func caCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "ca", Short: "show or rotate the cluster CA"}
	show := func(cmd *cobra.Command, v adminapi.CAView) error {
		if jsonOut {
			return cli.PrintJSON(cmd.OutOrStdout(), v)
		}
		fmt.Fprintf(cmd.OutOrStdout(), "CA           %s\nfingerprint  %s\nvalid        %s to %s\ntrust domain %s\nendpoint     %s\n", v.Subject, v.Fingerprint, v.NotBefore.Format(time.RFC3339), v.NotAfter.Format(time.RFC3339), v.TrustDomain, v.Endpoint)
		return nil
	}
	cmd.AddCommand(&cobra.Command{
		Use: "show", Short: "show the current CA", Args: args(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			v, err := client().CA(cmd.Context())
			if err != nil {
				return err
			}
			return show(cmd, v)
		},
	}, &cobra.Command{
		Use: "rotate", Short: "make a new root CA; codes minted before are revoked (stale), tokens and keys go on until `ca retire`, nodes move over at renewal", Args: args(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			v, err := client().RotateCA(cmd.Context())
			if err != nil {
				return err
			}
			return show(cmd, v)
		},
	}, &cobra.Command{
		Use: "retire", Short: "end every root but the current one; secrets minted under them are revoked", Args: args(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			v, err := client().RetireCA(cmd.Context())
			if err != nil {
				return err
			}
			if jsonOut {
				return cli.PrintJSON(cmd.OutOrStdout(), v)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "retired every root but %s; %d secrets minted under them revoked\n", v.Fingerprint, v.RevokedSecrets)
			return nil
		},
	})
	return cmd
}

func eventsCommand() *cobra.Command {
	var follow bool
	var since string
	var types []string
	cmd := &cobra.Command{
		Use: "events [--since 1h|TIME] [--type PREFIX]", Short: "print the event log", Args: args(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			var from time.Time
			if since != "" {
				if d, err := time.ParseDuration(since); err == nil {
					from = time.Now().Add(-d)
				} else if from, err = time.Parse(time.RFC3339, since); err != nil {
					return cli.Usage(fmt.Errorf("--since %q: give a duration (1h30m) or a time (2026-01-02T15:04:05Z)", since))
				}
			}
			keep := func(ev cluster.Event) bool {
				if ev.Time.Before(from) {
					return false
				}
				if len(types) == 0 {
					return true
				}
				for _, t := range types {
					if ev.Type == t || strings.HasPrefix(ev.Type, t+".") {
						return true
					}
				}
				return false
			}
			c := client()
			after := ""
			for {
				var wait time.Duration
				if follow && after != "" {
					wait = 30 * time.Second
				}
				evs, err := c.Events(cmd.Context(), after, wait)
				if err != nil {
					if cmd.Context().Err() != nil {
						return nil
					}
					return err
				}
				for _, ev := range evs {
					after = ev.Seq
					if !keep(ev) {
						continue
					}
					if jsonOut {
						b, _ := json.Marshal(ev)
						fmt.Fprintln(cmd.OutOrStdout(), string(b))
					} else {
						fmt.Fprintf(cmd.OutOrStdout(), "%s  %-30s %s %s\n", ev.Time.Format(time.RFC3339), ev.Type, ev.Actor, fieldsText(ev.Fields))
					}
				}
				if !follow {
					return nil
				}
				if after == "" && len(evs) == 0 {
					after = " " // sorts before every seq: wait for the first event
				}
			}
		},
	}
	cmd.Flags().BoolVar(&follow, "follow", false, "keep printing new events")
	cmd.Flags().StringVar(&since, "since", "", "only events since this long ago (1h) or this time (RFC 3339)")
	cmd.Flags().StringSliceVar(&types, "type", nil, "only events of this type or family (node.joined; security matches security.*) (repeatable)")
	return cmd
}

func fieldsText(f map[string]any) string {
	var parts []string
	for k, v := range f {
		parts = append(parts, fmt.Sprint(k, "=", v))
	}
	sort.Strings(parts)
	return strings.Join(parts, " ")
}

// parseKSF reads Argon2id parameters given as TIME,MEMORY_KIB,THREADS.
func parseKSF(s string) (pake.KSFParams, error) {
	f := strings.Split(s, ",")
	if len(f) != 3 {
		return pake.KSFParams{}, fmt.Errorf("%q: want TIME,MEMORY_KIB,THREADS", s)
	}
	var n [3]uint64
	for i, v := range f {
		var err error
		if n[i], err = strconv.ParseUint(strings.TrimSpace(v), 10, 32); err != nil {
			return pake.KSFParams{}, fmt.Errorf("%q: want TIME,MEMORY_KIB,THREADS", s)
		}
	}
	p := pake.KSFParams{Time: uint32(n[0]), MemoryKiB: uint32(n[1]), Threads: uint8(min(n[2], 255))}
	if err := p.CheckArgon2id(); err != nil {
		return pake.KSFParams{}, err
	}
	return p, nil
}
