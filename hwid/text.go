package hwid

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// textHeader opens the human output: the facts are claims.
const textHeader = "Hardware identity this machine claims (self-reported, not attested)"

// Text returns the report as WriteText writes it.
func (r Report) Text() string {
	var b strings.Builder
	_ = r.WriteText(&b) // a strings.Builder never fails
	return b.String()
}

// WriteText writes the report for a person (`stratum-agent hwid`): each
// fact with where it came from, then the notes.
func (r Report) WriteText(w io.Writer) error {
	f := r.Facts
	rows := []struct {
		label, fact string
		values      []string
	}{
		{"product UUID", FactProductUUID, one(f.ProductUUID)},
		{"serial", FactSerial, one(f.Serial)},
		{"board serial", FactBoardSerial, one(f.BoardSerial)},
		{"vendor", FactVendor, one(f.Vendor)},
		{"product name", FactProductName, one(f.ProductName)},
		{"MACs", FactMACs, f.MACs},
		{"GPU UUIDs", FactGPUUUIDs, f.GPUUUIDs},
		{"hostname", FactHostname, one(f.Hostname)},
	}

	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, textHeader)
	fmt.Fprintln(tw)
	for _, row := range rows {
		if len(row.values) == 0 {
			fmt.Fprintf(tw, "  %s\t(none)\n", row.label)
			continue
		}
		for i, v := range row.values {
			label := row.label
			if i > 0 {
				label = ""
			}
			fmt.Fprintf(tw, "  %s\t%s\n", label, v)
		}
		if src := r.Sources[row.fact]; src != "" {
			fmt.Fprintf(tw, "  \tfrom %s\n", src)
		}
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write hardware identity: %w", err)
	}

	var b strings.Builder
	if len(r.Notes) > 0 {
		b.WriteString("\nNotes:\n")
		for _, n := range r.Notes {
			b.WriteString("  - " + n + "\n")
		}
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("write hardware identity: %w", err)
	}
	return nil
}

func one(v string) []string {
	if v == "" {
		return nil
	}
	return []string{v}
}
