package main

import (
	"sort"

	"github.com/stratumjoin/stratum/pki"
)

func fmtFP(fp [32]byte) string { return pki.FormatFingerprint(fp) }

func sortStrings(s []string) { sort.Strings(s) }
