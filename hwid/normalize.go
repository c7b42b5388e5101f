package hwid

import "github.com/stratumjoin/stratum/internal/identity"

// Kinds of value that IsPlaceholder knows. They are the names of the
// `expect` fields (the joinTokens API, docs/api.md) and of the facts they pin, so the listener can
// pass its field name straight through.
const (
	KindProductUUID = identity.KindProductUUID
	KindSerial      = identity.KindSerial
	KindBoardSerial = identity.KindBoardSerial
	KindVendor      = identity.KindVendor
	KindProductName = identity.KindProductName
	KindMAC         = identity.KindMAC
	KindGPUUUID     = identity.KindGPUUUID
)

// IsPlaceholder reports whether value, claimed for the given kind (one of
// the Kind constants; other kinds get the generic text rules), is a value
// that firmware or drivers use when there is no real identity: such a value
// is shared by many machines and must never pin one. Comparison is
// case-insensitive and ignores surrounding white space. It says nothing
// about whether value is well-formed; callers validate the format apart.
//
// The rules live in internal/identity, which the listener applies to
// `expect` pins too.
func IsPlaceholder(kind, value string) bool {
	return identity.IsPlaceholder(kind, value)
}

// placeholderReason says why value is a placeholder for kind, or "" when it
// is not one.
func placeholderReason(kind, value string) string {
	return identity.PlaceholderReason(kind, value)
}

// NormalizeMAC returns s, a 48-bit MAC address in any common notation
// (aa:bb:cc:dd:ee:ff, AA-BB-CC-DD-EE-FF, aabb.ccdd.eeff, aabbccddeeff), as
// lower-case colon-separated hex.
func NormalizeMAC(s string) (string, error) { return identity.NormalizeMAC(s) }

// NormalizeUUID returns s trimmed and upper-cased, with braces dropped and
// dashes put in the 8-4-4-4-12 places when s is 32 bare hex digits. It does
// not validate: see isUUID.
func NormalizeUUID(s string) string { return identity.NormalizeUUID(s) }

// NormalizeGPUUUID returns s as nvidia-smi prints it: "GPU-" followed by a
// lower-case 8-4-4-4-12 UUID.
func NormalizeGPUUUID(s string) (string, error) { return identity.NormalizeGPUUUID(s) }

// isUUID reports whether s has the 8-4-4-4-12 hex form.
func isUUID(s string) bool { return identity.IsUUID(s) }
