package hwid

import (
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strings"
)

// Kinds of value that IsPlaceholder knows. They are the names of the
// `expect` fields (seed 000) and of the facts they pin, so the listener can
// pass its field name straight through.
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
// lower-casing and collapsing runs of spaces. They are never identities in
// any field.
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
	return placeholderReason(kind, value) != ""
}

// placeholderReason says why value is a placeholder for kind, or "" when it
// is not one.
func placeholderReason(kind, value string) string {
	text := strings.Join(strings.Fields(strings.ToLower(value)), " ")
	if text == "" {
		return "empty"
	}
	if placeholderTexts[text] {
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
		if strings.Contains(text, "serial number") || strings.HasPrefix(text, "to be filled") {
			return "a firmware placeholder"
		}
	}
	if strings.HasPrefix(text, "to be filled") {
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

// NormalizeMAC returns s, a 48-bit MAC address in any common notation
// (aa:bb:cc:dd:ee:ff, AA-BB-CC-DD-EE-FF, aabb.ccdd.eeff, aabbccddeeff), as
// lower-case colon-separated hex.
func NormalizeMAC(s string) (string, error) {
	s = strings.TrimSpace(s)
	var hw net.HardwareAddr
	if len(s) == 12 && isHex(s) {
		b, _ := hex.DecodeString(s)
		hw = b
	} else {
		var err error
		hw, err = net.ParseMAC(s)
		if err != nil {
			return "", fmt.Errorf("parse mac %q: %w", s, err)
		}
	}
	if len(hw) != 6 {
		return "", fmt.Errorf("mac %q: %d bytes, not a 48-bit MAC address", s, len(hw))
	}
	return hw.String(), nil
}

// NormalizeUUID returns s trimmed and upper-cased, with braces dropped and
// dashes put in the 8-4-4-4-12 places when s is 32 bare hex digits. It does
// not validate: see isUUID.
func NormalizeUUID(s string) string {
	s = strings.ToUpper(strings.TrimSpace(s))
	s = strings.TrimSuffix(strings.TrimPrefix(s, "{"), "}")
	if len(s) == 32 && isHex(s) {
		s = s[0:8] + "-" + s[8:12] + "-" + s[12:16] + "-" + s[16:20] + "-" + s[20:32]
	}
	return s
}

// errNotGPUUUID is wrapped when a GPU UUID is not "GPU-" plus a UUID.
var errNotGPUUUID = errors.New(`not "GPU-" followed by a UUID`)

// NormalizeGPUUUID returns s as nvidia-smi prints it: "GPU-" followed by a
// lower-case 8-4-4-4-12 UUID. GPU UUIDs keep NVIDIA's lower case (unlike
// product UUIDs) so they match what operators copy from nvidia-smi; the
// listener compares case-insensitively anyway.
func NormalizeGPUUUID(s string) (string, error) {
	s = strings.TrimSpace(s)
	if len(s) < 4 || !strings.EqualFold(s[:4], "GPU-") {
		return "", fmt.Errorf("gpu uuid %q: %w", s, errNotGPUUUID)
	}
	u := NormalizeUUID(s[4:])
	if !isUUID(u) {
		return "", fmt.Errorf("gpu uuid %q: %w", s, errNotGPUUUID)
	}
	return "GPU-" + strings.ToLower(u), nil
}

// isUUID reports whether s has the 8-4-4-4-12 hex form.
func isUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i, c := range s {
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !isHexDigit(c) {
				return false
			}
		}
	}
	return true
}

func isHex(s string) bool {
	for _, c := range s {
		if !isHexDigit(c) {
			return false
		}
	}
	return true
}

func isHexDigit(c rune) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}
