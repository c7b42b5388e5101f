// Package joincode parses and mints the three forms of join secret that
// Stratum Join accepts (docs/architecture.md#secrets) and splits each into its public
// locator, which picks the OPAQUE record, and the password, which is the
// whole secret and never leaves the agent.
//
//	join code   4F7K2-Q9MXZ-T          10 Crockford base32 symbols + 1 check symbol (GF(32), better than Luhn); locator = first 2 (the selector)
//	join token  bcjt_<tokenId>.<secret> locator = tokenId (jt_...)
//	join key    dnjoin-<ID>-<secret>    locator = dnjoin-<ID>
//
// A Secret formats as "[redacted]" under every fmt verb and in slog, so a
// stray log call cannot leak it.
package joincode

import (
	"crypto/rand"
	"encoding/base32"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
)

// Kind says which of the three forms a secret has.
type Kind int

const (
	KindCode  Kind = iota + 1 // a typed join code
	KindToken                 // a joinTokens bearer token
	KindKey                   // a join key
)

func (k Kind) String() string {
	switch k {
	case KindCode:
		return "join code"
	case KindToken:
		return "join token"
	case KindKey:
		return "join key"
	}
	return "unknown"
}

// Crockford is the Crockford base32 alphabet (no I, L, O, U).
const Crockford = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"

// CodeSymbols is the number of random symbols in a code (50 bits); the
// check symbol comes on top.
const CodeSymbols = 10

// SelectorLen is the number of leading code symbols that form the selector.
const SelectorLen = 2

// Selectors is how many distinct selectors exist.
const Selectors = 32 * 32

var (
	// ErrCheckSymbol means the code's check symbol does not match: a typo,
	// caught before it costs an attempt.
	ErrCheckSymbol = errors.New("the code's check symbol does not match: check for a typo")
	// ErrFormat means the input is none of the three forms.
	ErrFormat = errors.New("not a join code, join token or join key")
)

// Secret is a parsed join secret.
type Secret struct {
	Kind     Kind
	Locator  string // public: which record
	password string // the whole normalised secret
}

// Password returns the OPAQUE password: the whole normalised secret.
func (s Secret) Password() []byte { return []byte(s.password) }

// Display returns the secret in its canonical human form (codes grouped
// 5-5-1). Only the minting path shows it, once.
func (s Secret) Display() string {
	if s.Kind == KindCode {
		return s.password[:5] + "-" + s.password[5:10] + "-" + s.password[10:]
	}
	return s.password
}

// String keeps the secret out of every formatted output.
func (s Secret) String() string { return fmt.Sprintf("%s %s [redacted]", s.Kind, s.Locator) }

// GoString keeps the secret out of %#v.
func (s Secret) GoString() string { return s.String() }

// LogValue keeps the secret out of slog.
func (s Secret) LogValue() slog.Value {
	return slog.GroupValue(slog.String("kind", s.Kind.String()), slog.String("locator", s.Locator))
}

// Format keeps the secret out of every fmt verb, %x and %q included.
func (s Secret) Format(f fmt.State, _ rune) { _, _ = f.Write([]byte(s.String())) }

var (
	tokenRE = regexp.MustCompile(`^bcjt_(jt_[0-9a-hjkmnp-tv-z]{26,52})\.([0-9a-hjkmnp-tv-z]{32,64})$`)
	keyRE   = regexp.MustCompile(`^(dnjoin-[A-Z2-7]{26})-([A-Z2-7]{52,64})$`)
)

// Parse recognises any of the three forms. Codes are folded: case,
// hyphens and spaces are ignored, O->0 and I/L->1.
func Parse(input string) (Secret, error) {
	in := strings.TrimSpace(input)
	switch {
	case strings.HasPrefix(in, "bcjt_"):
		m := tokenRE.FindStringSubmatch(in)
		if m == nil {
			return Secret{}, fmt.Errorf("%w: malformed join token", ErrFormat)
		}
		return Secret{Kind: KindToken, Locator: m[1], password: in}, nil
	case strings.HasPrefix(in, "dnjoin-"):
		m := keyRE.FindStringSubmatch(in)
		if m == nil {
			return Secret{}, fmt.Errorf("%w: malformed join key", ErrFormat)
		}
		return Secret{Kind: KindKey, Locator: m[1], password: in}, nil
	}
	return ParseCode(in)
}

// ParseCode parses a typed join code and verifies its check symbol.
func ParseCode(input string) (Secret, error) {
	var b strings.Builder
	for _, r := range input {
		switch {
		case r == '-' || r == ' ' || r == '\t':
			continue
		case r >= 'a' && r <= 'z':
			r -= 'a' - 'A'
		}
		switch r {
		case 'O':
			r = '0'
		case 'I', 'L':
			r = '1'
		}
		if r > 0x7f || !strings.ContainsRune(Crockford, r) {
			return Secret{}, fmt.Errorf("%w: a join code uses only 0-9 and A-Z without U", ErrFormat)
		}
		b.WriteRune(r)
	}
	norm := b.String()
	if len(norm) != CodeSymbols+1 {
		return Secret{}, fmt.Errorf("%w: a join code has %d symbols, this has %d", ErrFormat, CodeSymbols+1, len(norm))
	}
	if checkSymbol(norm[:CodeSymbols]) != norm[CodeSymbols] {
		return Secret{}, ErrCheckSymbol
	}
	return Secret{Kind: KindCode, Locator: norm[:SelectorLen], password: norm}, nil
}

// checkSymbol is a weighted sum over GF(32), sum of alpha^(i+1)*symbol_i
// with alpha a primitive element (x^5+x^2+1). Unlike Luhn mod 32, which
// misses the transposition of 0 and V, it catches every single substitution
// (alpha^i is never zero) and every adjacent transposition
// ((a+b)*alpha^i*(1+alpha) is never zero for a != b).
func checkSymbol(symbols string) byte {
	var sum, weight byte = 0, 1
	for i := 0; i < len(symbols); i++ {
		weight = gf32Mul(weight, 2)
		sum ^= gf32Mul(weight, byte(strings.IndexByte(Crockford, symbols[i])))
	}
	return Crockford[sum]
}

func gf32Mul(a, b byte) byte {
	var p byte
	for ; b != 0; b >>= 1 {
		if b&1 != 0 {
			p ^= a
		}
		a <<= 1
		if a&0x20 != 0 {
			a ^= 0x25
		}
	}
	return p & 31
}

var (
	tokenLocatorRE = regexp.MustCompile(`^jt_[0-9a-hjkmnp-tv-z]{26,52}$`)
	keyLocatorRE   = regexp.MustCompile(`^dnjoin-[A-Z2-7]{26}$`)
)

// LocatorKind says which form of secret a locator belongs to by its shape
// alone, so the listener can treat every locator of one shape alike
// whether or not a secret has it; 0 for a locator of no form.
func LocatorKind(locator string) Kind {
	switch {
	case ValidSelector(locator):
		return KindCode
	case tokenLocatorRE.MatchString(locator):
		return KindToken
	case keyLocatorRE.MatchString(locator):
		return KindKey
	}
	return 0
}

// ValidSelector reports whether s is a two-symbol canonical selector.
func ValidSelector(s string) bool {
	return len(s) == SelectorLen && strings.IndexByte(Crockford, s[0]) >= 0 && strings.IndexByte(Crockford, s[1]) >= 0
}

// SelectorAt returns the i-th selector (0 <= i < Selectors).
func SelectorAt(i int) string {
	return string([]byte{Crockford[i/32%32], Crockford[i%32]})
}

// NewCode mints a code with the given selector; the other 8 symbols and so
// 40 bits come from crypto/rand.
func NewCode(selector string) (Secret, error) {
	if !ValidSelector(selector) {
		return Secret{}, fmt.Errorf("invalid selector %q", selector)
	}
	buf := make([]byte, CodeSymbols-SelectorLen)
	if _, err := rand.Read(buf); err != nil {
		return Secret{}, fmt.Errorf("read random: %w", err)
	}
	sym := []byte(selector)
	for _, v := range buf {
		sym = append(sym, Crockford[v&31])
	}
	s := string(sym)
	return Secret{Kind: KindCode, Locator: selector, password: s + string(checkSymbol(s))}, nil
}

var lowerCrockford = base32.NewEncoding(strings.ToLower(Crockford)).WithPadding(base32.NoPadding)

// RandomLowerBase32 returns n random bytes as lowercase Crockford base32
// (the alphabet of the joinTokens API's ids).
func RandomLowerBase32(n int) (string, error) {
	buf := make([]byte, n)
	if _, err := rand.Read(buf); err != nil {
		return "", fmt.Errorf("read random: %w", err)
	}
	return lowerCrockford.EncodeToString(buf), nil
}

// LowerBase32 encodes b as lowercase Crockford base32.
func LowerBase32(b []byte) string { return lowerCrockford.EncodeToString(b) }

// NewToken returns a joinTokens bearer token for tokenID with a 160-bit secret.
func NewToken(tokenID string) (Secret, error) {
	sec, err := RandomLowerBase32(20)
	if err != nil {
		return Secret{}, err
	}
	return Parse("bcjt_" + tokenID + "." + sec)
}

// NewKeyID returns a fresh join key id, dnjoin-<26 base32>.
func NewKeyID() (string, error) {
	buf := make([]byte, 16)
	if _, err := rand.Read(buf); err != nil {
		return "", fmt.Errorf("read random: %w", err)
	}
	return "dnjoin-" + base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(buf), nil
}

// NewKey returns a join key for keyID with a 260-bit secret.
func NewKey(keyID string) (Secret, error) {
	buf := make([]byte, 33)
	if _, err := rand.Read(buf); err != nil {
		return Secret{}, fmt.Errorf("read random: %w", err)
	}
	sec := base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(buf)[:52]
	return Parse(keyID + "-" + sec)
}
