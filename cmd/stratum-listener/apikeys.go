package main

import (
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/stratumjoin/stratum/internal/cli"
	"github.com/stratumjoin/stratum/internal/cluster"
	"github.com/stratumjoin/stratum/listener/adminapi"
)

func apikeysCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "apikeys", Short: "create, list and revoke API keys of the HTTPS admin API"}
	var req adminapi.APIKeyRequest
	var grants []string
	var ttl time.Duration
	create := &cobra.Command{
		Use:   "create --tenant T (--grant ACTION@RESOURCE | --scope SCOPE)...",
		Short: "create an API key bound to a tenant; it is printed once",
		Long: "create an API key bound to a tenant; it is printed once.\n\n" +
			"Grants (joinTokens and join-codes actions) are ACTION@RESOURCE, the resource exact or a pattern:\n" +
			"  actions:   " + strings.Join(adminapi.Actions(), ", ") + "\n" +
			"  resources: compute-pool/<poolId>, compute-pool/*, cluster, *\n" +
			"Scopes (join keys): " + strings.Join(adminapi.Scopes(), ", "),
		Args: args(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if req.Tenant == "" {
				return cli.Usage(fmt.Errorf("--tenant is required"))
			}
			req.Grants = nil
			for _, g := range grants {
				action, resource, ok := strings.Cut(g, "@")
				if !ok || action == "" || resource == "" {
					return cli.Usage(fmt.Errorf("--grant %q: write ACTION@RESOURCE, e.g. %s@compute-pool/*", g, adminapi.ActionCreateJoinToken))
				}
				req.Grants = append(req.Grants, cluster.Grant{Action: action, Resource: resource})
			}
			req.TTLSeconds = int(ttl / time.Second)
			k, err := client().CreateAPIKey(cmd.Context(), req)
			if err != nil {
				return err
			}
			if jsonOut {
				return cli.PrintJSON(cmd.OutOrStdout(), k)
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "api key  %s\nid       %s\ntenant   %s\n", k.Key, k.ID, k.Tenant)
			for _, g := range k.Grants {
				fmt.Fprintf(w, "grant    %s@%s\n", g.Action, g.Resource)
			}
			for _, s := range k.Scopes {
				fmt.Fprintf(w, "scope    %s\n", s)
			}
			if k.ExpiresAt != nil {
				fmt.Fprintf(w, "expires  %s\n", k.ExpiresAt.Format(time.RFC3339))
			}
			fmt.Fprintln(w, "\nThe key is shown only this once; callers send it as `Authorization: Bearer <key>`.")
			return nil
		},
	}
	create.Flags().StringVar(&req.Tenant, "tenant", "", "tenant (organization) the key acts for")
	create.Flags().StringVar(&req.Name, "name", "", "a name to tell keys apart")
	create.Flags().StringArrayVar(&grants, "grant", nil, "ACTION@RESOURCE the key may do (repeatable)")
	create.Flags().StringArrayVar(&req.Scopes, "scope", nil, "scope the key holds (repeatable)")
	create.Flags().DurationVar(&ttl, "ttl", 0, "lifetime of the key (default: no expiry)")

	list := &cobra.Command{
		Use: "list", Short: "list API keys (never their secrets)", Args: args(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			keys, err := client().APIKeys(cmd.Context())
			if err != nil {
				return err
			}
			if jsonOut {
				return cli.PrintJSON(cmd.OutOrStdout(), map[string]any{"items": keys})
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 2, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tNAME\tTENANT\tSTATE\tGRANTS\tSCOPES\tCREATED")
			for _, k := range keys {
				var gs []string
				for _, g := range k.Grants {
					gs = append(gs, g.Action+"@"+g.Resource)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", k.ID, k.Name, k.Tenant, k.State, strings.Join(gs, ","), strings.Join(k.Scopes, ","), k.CreatedAt.Format(time.RFC3339))
			}
			return tw.Flush()
		},
	}
	revoke := &cobra.Command{
		Use: "revoke ID", Short: "revoke an API key at once", Args: args(1),
		RunE: func(cmd *cobra.Command, a []string) error {
			k, err := client().RevokeAPIKey(cmd.Context(), a[0])
			if err != nil {
				return err
			}
			if jsonOut {
				return cli.PrintJSON(cmd.OutOrStdout(), k)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "revoked api key %s at %s\n", k.ID, k.RevokedAt.Format(time.RFC3339))
			return nil
		},
	}
	cmd.AddCommand(create, list, revoke)
	return cmd
}

func registryCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "registry", Short: "show the tenants, sites, pools, networks and roles the listener serves"}
	cmd.AddCommand(&cobra.Command{
		Use: "show", Short: "show the registry the listener was started with", Args: args(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			reg, err := client().Registry(cmd.Context())
			if err != nil {
				return err
			}
			if jsonOut {
				return cli.PrintJSON(cmd.OutOrStdout(), reg)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 2, 2, ' ', 0)
			fmt.Fprintln(tw, "TENANT\tJOIN KEYS\tREQUESTS/S\tBURST")
			for _, t := range reg.Tenants {
				fmt.Fprintf(tw, "%s\t%d\t%g\t%d\n", t.ID, t.Limits.JoinKeys, t.Limits.RequestsPerSecond, t.Limits.Burst)
			}
			fmt.Fprintln(tw, "\nSITE\tOWNER\tCUSTOM")
			for _, s := range reg.Sites {
				fmt.Fprintf(tw, "%s\t%s\t%t\n", s.ID, s.Owner, s.Custom)
			}
			fmt.Fprintln(tw, "\nPOOL\tTENANT\tSITE\tAGENT\tK8S PLATFORM-OPERATED")
			for _, p := range reg.Pools {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%t\n", p.ID, p.Tenant, p.Site, p.Agent, p.Policy.Kubernetes.PlatformOperated)
			}
			if len(reg.Networks) > 0 {
				fmt.Fprintln(tw, "\nNETWORK\tTENANT\tCIDR\tIPV6 PREFIX")
				for _, n := range reg.Networks {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", n.ID, n.Tenant, n.CIDR, n.IPv6Prefix)
				}
			}
			if len(reg.Roles) > 0 {
				fmt.Fprintln(tw, "\nROLE\tTENANT")
				for _, r := range reg.Roles {
					fmt.Fprintf(tw, "%s\t%s\n", r.ID, r.Tenant)
				}
			}
			return tw.Flush()
		},
	})
	return cmd
}
