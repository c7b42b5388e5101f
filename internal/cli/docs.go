package cli

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
)

// AddDocs gives root a hidden `gen-docs DIR` command that writes the man
// pages (DIR/man/man1) and the bash, zsh and fish completions
// (DIR/completions) that `make package` ships.
func AddDocs(root *cobra.Command) {
	root.AddCommand(&cobra.Command{
		Use:    "gen-docs DIR",
		Short:  "write man pages and shell completions into DIR",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			return GenDocs(root, args[0])
		},
	})
}

// GenDocs writes root's man pages and completions below dir.
func GenDocs(root *cobra.Command, dir string) error {
	man := filepath.Join(dir, "man", "man1")
	comp := filepath.Join(dir, "completions")
	for _, d := range []string{man, comp} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	root.DisableAutoGenTag = true // reproducible pages: no generation date
	if err := doc.GenManTree(root, &doc.GenManHeader{Title: root.Name(), Section: "1", Source: "Stratum Join " + Build().Version}, man); err != nil {
		return fmt.Errorf("man pages: %w", err)
	}
	name := root.Name()
	for file, gen := range map[string]func(string) error{
		name + ".bash": func(p string) error { return root.GenBashCompletionFileV2(p, true) },
		"_" + name:     root.GenZshCompletionFile,
		name + ".fish": func(p string) error { return root.GenFishCompletionFile(p, true) },
	} {
		if err := gen(filepath.Join(comp, file)); err != nil {
			return fmt.Errorf("completion %s: %w", file, err)
		}
	}
	return nil
}
