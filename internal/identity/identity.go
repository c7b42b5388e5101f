// Package identity holds the rules for the hardware identifiers a machine
// claims (SMBIOS product UUID and serials, NIC MACs, NVIDIA GPU UUIDs): how
// each is written in canonical form, and which values are firmware or
// driver placeholders that many unrelated machines share.
//
// Both sides use it: the agent's hardware probe (package hwid) drops
// placeholders instead of reporting them, and the listener refuses them as
// `expect` pins and never keys a node's identity on them (docs/architecture.md
// section 5). It is pure Go with no dependencies, so the listener binary
// does not link the probes (ghw, netlink, NVML) to apply the same rules.
package identity

import (
	"encoding/hex"
	"strings"
)

// Kinds of value that IsPlaceholder knows. They are the names of the
// `expect` fields (the joinTokens API, docs/api.md) and of the facts they pin, so a caller can pass
// its field name straight through.
const (
	KindProductUUID = "productUuid"
	KindSerial      = "serial"
	KindBoardSerial = "boardSerial"
	KindVendor      = "vendor"
	KindProductName = "productName"
	KindMAC         = "mac"
	KindGPUUUID     = "gpuUuid"
)

// placeholderTexts are strings firmware ships in SMBIOS text fields when the
// board maker never programmed a real value. Compared after trimming,
// lower-casing and collapsing runs of spaces, and again in compact form
// (see compact). They are never identities in any field.
var placeholderTexts = map[string]bool{
	"":                            true,
	"unknown":                     true,
	"none":                        true,
	"null":                        true,
	"n/a":                         true,
	"na":                          true,
	"not specified":               true,
	"not applicable":              true,
	"not available":               true,
	"not present":                 true,
	"not settable":                true,
	"default string":              true,
	"default":                     true,
	"to be filled by o.e.m.":      true,
	"to be filled by oem":         true,
	"to be filled by o.e.m":       true,
	"oem":                         true,
	"o.e.m.":                      true,
	"oem not specified":           true,
	"system serial number":        true,
	"chassis serial number":       true,
	"base board serial number":    true,
	"baseboard serial number":     true,
	"board serial number":         true,
	"serial number":               true,
	"serialnumber":                true,
	"system product name":         true,
	"system manufacturer":         true,
	"system version":              true,
	"system name":                 true,
	"product name":                true,
	"type1productconfigid":        true,
	"type2 - board serial number": true,
	"0123456789":                  true,
	"123456789":                   true,
	"1234567890":                  true,
	"12345678":                    true,
	"$(default_string)":           true,
	"invalid":                     true,
	"0":                           true,
	".":                           true,
	"x":                           true,
}

// compactPlaceholders are placeholderTexts in compact form, so that
// "DefaultString", "Not-Specified" or "To_Be_Filled_By_OEM" (spellings an
// operator or a firmware may use where spaces are not allowed, as in seed
// 000's serial pattern) are caught too.
var compactPlaceholders = func() map[string]bool {
	m := make(map[string]bool, len(placeholderTexts))
	for t := range placeholderTexts {
		m[compact(t)] = true
	}
	return m
}()

// compact drops the separators that placeholder spellings vary in.
func compact(text string) string {
	return strings.Map(func(r rune) rune {
		switch r {
		case ' ', '.', '-', '_':
			return -1
		}
		return r
	}, text)
}

// placeholderUUIDs are well-formed UUIDs that many unrelated boards ship.
// 03000200-... is the AMI BIOS template value as Linux shows it; the second
// is the same bytes in the other SMBIOS byte order (pre-2.6 readers).
var placeholderUUIDs = map[string]bool{
	"03000200-0400-0500-0006-000700080009": true,
	"00020003-0004-0005-0006-000700080009": true,
	"12345678-1234-5678-90AB-CDDEEFAABBCC": true,
}

// IsPlaceholder reports whether value, claimed for the given kind (one of
// the Kind constants; other kinds get the generic text rules), is a value
// that firmware or drivers use when there is no real identity: such a value
// is shared by many machines and must never pin one. Comparison is
// case-insensitive and ignores surrounding white space. It says nothing
// about whether value is well-formed; callers validate the format apart.
func IsPlaceholder(kind, value string) bool {
	return PlaceholderReason(kind, value) != ""
}

// PlaceholderReason says why value is a placeholder for kind ("all zeros",
// "a firmware placeholder", ...), or "" when it is not one.
func PlaceholderReason(kind, value string) string {
	text := strings.Join(strings.Fields(strings.ToLower(value)), " ")
	if text == "" {
		return "empty"
	}
	if placeholderTexts[text] || compactPlaceholders[compact(text)] {
		return "a firmware placeholder"
	}
	switch kind {
	case KindProductUUID:
		if placeholderUUIDs[NormalizeUUID(value)] {
			return "a template UUID many boards ship"
		}
	case KindGPUUUID:
		text = strings.TrimPrefix(text, "gpu-")
	case KindMAC:
		mac, err := NormalizeMAC(value)
		if err != nil {
			return ""
		}
		switch mac {
		case "00:00:00:00:00:00":
			return "all zeros"
		case "ff:ff:ff:ff:ff:ff":
			return "the broadcast address"
		}
		if first, _ := hex.DecodeString(mac[:2]); first[0]&1 == 1 {
			return "a multicast address"
		}
		return ""
	case KindSerial, KindBoardSerial:
		// Firmware templates spell these many ways ("Type2 - Board
		// Serial Number", "Base Board Serial Number"); no real serial
		// contains the words.
		if strings.Contains(compact(text), "serialnumber") {
			return "a firmware placeholder"
		}
	}
	if strings.HasPrefix(compact(text), "tobefilled") {
		return "a firmware placeholder"
	}
	if c, ok := oneRepeatedChar(text); ok {
		switch c {
		case '0':
			return "all zeros"
		case 'f':
			return "all F"
		default:
			return "one character repeated"
		}
	}
	return ""
}

// oneRepeatedChar reports whether text, ignoring separators, is a single
// character repeated (all-zero and all-F UUIDs, "00000000", "xxxxxxxx",
// "........"), returning that character.
func oneRepeatedChar(text string) (rune, bool) {
	var first rune
	n := 0
	for _, c := range text {
		if c == '-' || c == ':' || c == ' ' || c == '{' || c == '}' {
			continue
		}
		if n == 0 {
			first = c
		} else if c != first {
			return 0, false
		}
		n++
	}
	if n == 0 {
		// Only separators: as good as empty.
		return '-', true
	}
	return first, n > 1
}
