package identity

import (
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strings"
)

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
// not validate: see IsUUID.
func NormalizeUUID(s string) string {
	s = strings.ToUpper(strings.TrimSpace(s))
	s = strings.TrimSuffix(strings.TrimPrefix(s, "{"), "}")
	if len(s) == 32 && isHex(s) {
		s = s[0:8] + "-" + s[8:12] + "-" + s[12:16] + "-" + s[16:20] + "-" + s[20:32]
	}
	return s
}

// ErrNotGPUUUID is wrapped when a GPU UUID is not "GPU-" plus a UUID.
var ErrNotGPUUUID = errors.New(`not "GPU-" followed by a UUID`)

// NormalizeGPUUUID returns s as nvidia-smi prints it: "GPU-" followed by a
// lower-case 8-4-4-4-12 UUID. GPU UUIDs keep NVIDIA's lower case (unlike
// product UUIDs) so they match what operators copy from nvidia-smi; the
// listener compares case-insensitively anyway.
func NormalizeGPUUUID(s string) (string, error) {
	s = strings.TrimSpace(s)
	if len(s) < 4 || !strings.EqualFold(s[:4], "GPU-") {
		return "", fmt.Errorf("gpu uuid %q: %w", s, ErrNotGPUUUID)
	}
	u := NormalizeUUID(s[4:])
	if !IsUUID(u) {
		return "", fmt.Errorf("gpu uuid %q: %w", s, ErrNotGPUUUID)
	}
	return "GPU-" + strings.ToLower(u), nil
}

// IsUUID reports whether s has the 8-4-4-4-12 hex form.
func IsUUID(s string) bool {
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
