package main

import (
	"errors"
	"fmt"
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
