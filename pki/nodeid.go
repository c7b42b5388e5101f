package pki

import (
	"crypto/rand"
	"fmt"
)

const (
	nodeIDPrefix = "node-"
	nodeIDChars  = 26 // 130 bits
	// crockford is Crockford's base32 alphabet, lowercase: no i, l, o, u.
	crockford = "0123456789abcdefghjkmnpqrstvwxyz"
)

// NodeID draws a new node id: "node-" and 26 lowercase Crockford base32
// characters, 130 bits from crypto/rand.
func NodeID() (string, error) {
	var raw [17]byte // 136 bits, of which the first 130 are used
	if _, err := rand.Read(raw[:]); err != nil {
		return "", fmt.Errorf("draw node id: %w", err)
	}
	out := make([]byte, 0, len(nodeIDPrefix)+nodeIDChars)
	out = append(out, nodeIDPrefix...)
	for i := range nodeIDChars {
		bit := i * 5
		// Five bits starting at bit, read from a 16-bit window that the
		// 17th byte keeps in range for the last symbol.
		window := uint16(raw[bit/8])<<8 | uint16(raw[bit/8+1])
		out = append(out, crockford[(window>>(11-bit%8))&0x1f])
	}
	return string(out), nil
}

// ValidNodeID reports whether s is a node id in canonical form, as NodeID
// makes them: lowercase only, no Crockford aliases.
func ValidNodeID(s string) bool {
	if len(s) != len(nodeIDPrefix)+nodeIDChars || s[:len(nodeIDPrefix)] != nodeIDPrefix {
		return false
	}
	for i := len(nodeIDPrefix); i < len(s); i++ {
		if !isCrockfordLower(s[i]) {
			return false
		}
	}
	return true
}

func isCrockfordLower(c byte) bool {
	switch {
	case c >= '0' && c <= '9':
		return true
	case c >= 'a' && c <= 'z':
		return c != 'i' && c != 'l' && c != 'o' && c != 'u'
	}
	return false
}
