package pki

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"strings"
)

// FormatFingerprint writes fp as upper-case hex pairs joined by ':', the
// caFingerprint format of the join-codes API (the join-codes API, docs/api.md).
func FormatFingerprint(fp [32]byte) string {
	const digits = "0123456789ABCDEF"
	out := make([]byte, 0, len(fp)*3-1)
	for i, b := range fp {
		if i > 0 {
			out = append(out, ':')
		}
		out = append(out, digits[b>>4], digits[b&0x0f])
	}
	return string(out)
}

// ParseFingerprint reads a SHA-256 fingerprint in either case, as 64 hex
// digits or as 32 colon-separated pairs (FormatFingerprint's form).
// Surrounding white space is ignored.
func ParseFingerprint(s string) ([32]byte, error) {
	var fp [32]byte
	s = strings.TrimSpace(s)
	var digits string
	switch len(s) {
	case 64:
		digits = s
	case 32*3 - 1:
		var b strings.Builder
		for i := 0; i < len(s); i += 3 {
			if i+2 < len(s) && s[i+2] != ':' {
				return fp, errors.New("parse fingerprint: want hex pairs separated by ':'")
			}
			b.WriteString(s[i : i+2])
		}
		digits = b.String()
	default:
		return fp, errors.New("parse fingerprint: want 64 hex digits, with or without ':' between pairs")
	}
	if _, err := hex.Decode(fp[:], []byte(digits)); err != nil {
		return [32]byte{}, errors.New("parse fingerprint: not hexadecimal")
	}
	return fp, nil
}

// FingerprintOf is the SHA-256 of a certificate's DER, the form CA
// fingerprints take.
func FingerprintOf(cert *x509.Certificate) [32]byte {
	return sha256.Sum256(cert.Raw)
}
