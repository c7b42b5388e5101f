package main

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/stratumjoin/stratum/internal/cli"
	"github.com/stratumjoin/stratum/listener/adminapi"
	"github.com/stratumjoin/stratum/listener/adminclient"
)

// codeFlags names the `codes create` flag that sets each field of the
// join-code mint request, so a refusal speaks of --ttl, not ttlSeconds.
var codeFlags = map[string]string{
	"ttlSeconds":         "--ttl",
	"maxUses":            "--max-uses",
	"pool":               "--pool",
	"requireApproval":    "--require-approval",
	"allowReclaim":       "--allow-reclaim",
	"hosted":             "--hosted",
	"expect.productUuid": "--expect-product-uuid",
	"expect.serial":      "--expect-serial",
	"expect.mac":         "--expect-mac",
	"expect.gpuUuid":     "--expect-gpu-uuid",
	"expect.ekHash":      "--expect-ek",
	"description":        "--description",
	"labels":             "--label",
	"label":              "--label",
}

// inFlagTerms turns the API's refusal of invalid input into a usage error
// (exit 2) that names the flags: the operator typed flags, not fields.
func inFlagTerms(err error, flags map[string]string) error {
	var p *adminclient.ProblemError
	if !errors.As(err, &p) || p.Code != adminapi.CodeInvalidInput || len(p.Errors) == 0 {
		return err
	}
	var b strings.Builder
	b.WriteString("invalid flags:")
	for _, f := range p.Errors {
		name, ok := flags[f.Field]
		if key, isLabel := strings.CutPrefix(f.Field, "labels."); !ok && isLabel {
			name, ok = flags["labels"]+" "+key, true
		}
		if !ok {
			name = f.Field
		}
		msg := f.Message
		for field, flag := range flags {
			// only names no sentence has: expect.mac, ttlSeconds
			if strings.ContainsAny(field, ".ABCDEFGHIJKLMNOPQRSTUVWXYZ") {
				msg = strings.ReplaceAll(msg, field, flag)
			}
		}
		fmt.Fprintf(&b, "\n  %s: %s", name, msg)
	}
	return cli.Usage(errors.New(b.String()))
}

// parseLabels reads repeated --label KEY=VALUE flags; the listener checks
// the keys and values, this only the shape.
func parseLabels(flags []string) (map[string]string, error) {
	if len(flags) == 0 {
		return nil, nil
	}
	out := make(map[string]string, len(flags))
	for _, f := range flags {
		k, v, ok := strings.Cut(f, "=")
		if !ok || k == "" {
			return nil, cli.Usage(fmt.Errorf("--label %q: want KEY=VALUE", f))
		}
		if _, dup := out[k]; dup {
			return nil, cli.Usage(fmt.Errorf("--label %s given twice", k))
		}
		out[k] = v
	}
	return out, nil
}

// labelsText is labels as k=v,k=v in key order.
func labelsText(labels map[string]string) string {
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + labels[k]
	}
	return strings.Join(parts, ",")
}
