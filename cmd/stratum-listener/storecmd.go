package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/stratumjoin/stratum/internal/cli"
	"github.com/stratumjoin/stratum/internal/store/boltstore"
)

// storeCommand backs up, restores and checks the store (docs/store.md).
func storeCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "store", Short: "back up, restore and check the listener's store"}
	backup := &cobra.Command{
		Use:   "backup FILE",
		Short: "write a consistent copy of the running listener's store to FILE (a bbolt file)",
		Args:  args(1),
		RunE: func(cmd *cobra.Command, a []string) error {
			path := a[0]
			if _, err := os.Stat(path); err == nil {
				return fmt.Errorf("%s exists; choose a new file", path)
			}
			tmp, err := os.CreateTemp(filepath.Dir(path), ".backup-*")
			if err != nil {
				return err
			}
			defer os.Remove(tmp.Name())
			if err := tmp.Chmod(0o600); err != nil { // it holds the OPAQUE records
				tmp.Close()
				return err
			}
			n, err := client().Backup(cmd.Context(), tmp)
			if err == nil {
				err = tmp.Sync()
			}
			if cerr := tmp.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return fmt.Errorf("store backup: %w", err)
			}
			if err := boltstore.Check(tmp.Name()); err != nil {
				return fmt.Errorf("the backup does not check: %w", err)
			}
			if err := os.Rename(tmp.Name(), path); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "backed up %d bytes to %s\n", n, path)
			return nil
		},
	}
	var dataDir string
	restore := &cobra.Command{
		Use:   "restore BACKUP --data DIR",
		Short: "write BACKUP as the store of the data directory DIR, which must have none yet",
		Args:  args(1),
		RunE: func(cmd *cobra.Command, a []string) error {
			if dataDir == "" {
				return cli.Usage(fmt.Errorf("--data is required"))
			}
			path := filepath.Join(dataDir, "state.db")
			if err := boltstore.Restore(a[0], path); err != nil {
				return fmt.Errorf("store restore: %w", err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "restored %s into %s\n", a[0], path)
			return nil
		},
	}
	restore.Flags().StringVar(&dataDir, "data", "", "data directory (its keys/ from the old one: they are never in the store)")
	check := &cobra.Command{
		Use:   "check FILE",
		Short: "check a store file or backup (size, meta pages, every page and record); not while a listener has it open",
		Args:  args(1),
		RunE: func(cmd *cobra.Command, a []string) error {
			if err := boltstore.Check(a[0]); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: ok\n", a[0])
			return nil
		},
	}
	cmd.AddCommand(backup, restore, check)
	return cmd
}
