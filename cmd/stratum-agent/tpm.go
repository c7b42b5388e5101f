package main

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/spf13/cobra"

	"github.com/stratumjoin/stratum/agent"
	"github.com/stratumjoin/stratum/internal/cli"
	"github.com/stratumjoin/stratum/internal/tpm"
)

// tpmFlags choose where the node key lives.
type tpmFlags struct {
	device string // --tpm: auto, none or a device path
	sim    string // --tpm-sim HOST:PORT
}

func (f *tpmFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.device, "tpm", "auto", "TPM device for the node key: a path, none, or auto ("+tpm.DefaultDevice+" when present and usable)")
	cmd.Flags().StringVar(&f.sim, "tpm-sim", "", "use the TPM simulator at HOST:PORT (swtpm's TCP command port) instead of a device")
}

// explicit reports whether a TPM was asked for by name.
func (f *tpmFlags) explicit() bool { return f.sim != "" || (f.device != "auto" && f.device != "none") }

// locator resolves the flags for a node in stateDir: "" keeps the key in
// a file. auto takes the kernel's TPM when it exists and opens, and never
// moves a node that already has a key file; a TPM that exists but cannot
// be opened is reported and the file key used, as before TPM support.
func (f *tpmFlags) locator(stateDir string, logger *slog.Logger) (string, error) {
	switch {
	case f.sim != "" && f.device != "auto":
		return "", usage("give --tpm or --tpm-sim, not both")
	case f.sim != "":
		return tpm.SimPrefix + f.sim, nil
	case f.device == "none":
		return "", nil
	case f.device != "auto":
		return f.device, nil
	}
	st := agent.State{Dir: stateDir}
	if id, ok, err := st.Identity(); err == nil && ok {
		return id.TPM, nil // a joined node keeps where its key is
	}
	if _, err := os.Stat(stateDir + "/" + agent.KeyFile); err == nil {
		return "", nil
	}
	if _, err := os.Stat(tpm.DefaultDevice); err != nil {
		return "", nil
	}
	tp, err := tpm.Open(tpm.DefaultDevice)
	if err != nil {
		logger.Warn("a TPM is present but cannot be used; the node key goes into a file, unattested", "err", err)
		return "", nil
	}
	tp.Close()
	return tpm.DefaultDevice, nil
}

func tpmCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "tpm", Short: "the TPM that would hold this node's key"}
	var f tpmFlags
	ek := &cobra.Command{
		Use:   "ek [--tpm PATH | --tpm-sim HOST:PORT]",
		Short: "print the TPM's endorsement key hash, which `stratum-listener codes create --expect-ek` pins",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			loc := tpm.DefaultDevice
			if f.explicit() {
				var err error
				if loc, err = f.locator("", nil); err != nil {
					return err
				}
			}
			if loc == "" {
				return usage("--tpm none names no TPM")
			}
			tp, err := tpm.Open(loc)
			if err != nil {
				return err
			}
			defer tp.Close()
			h, err := tp.EKHash()
			if err != nil {
				return err
			}
			cert, err := tp.EKCert()
			if err != nil {
				return err
			}
			if jsonOut {
				return cli.PrintJSON(cmd.OutOrStdout(), map[string]any{"tpm": loc, "ekHash": h, "ekCertificate": cert != nil})
			}
			fmt.Fprintln(cmd.OutOrStdout(), h)
			if cert == nil {
				fmt.Fprintln(cmd.ErrOrStderr(), "note: this TPM holds no EK certificate; a listener with --tpm-ca-dir refuses it")
			}
			return nil
		},
	}
	f.register(ek)
	cmd.AddCommand(ek)
	return cmd
}
