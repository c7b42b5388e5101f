package wire

import "fmt"

// Sizes of the OPAQUE messages on the wire with the suite the protocol
// uses (ristretto255, SHA-512). internal/pake produces them and its tests
// check that it agrees; wire keeps them so that decoding a frame does not
// link OPAQUE.
const (
	KE1Size = 96
	KE2Size = 320
	KE3Size = 64
)

// KSFParams are Argon2id's time, memory (KiB) and threads. The listener
// records them per secret, so a secret minted under other parameters keeps
// working; the agent receives them in the Challenge and refuses values
// outside the bounds below. The zero value is no key stretching (OPAQUE's
// identity KSF): what tokens and keys use, whose 128 bits and more no
// offline search can cover, stretched or not (docs/secrets.md).
type KSFParams struct {
	Time      uint32 `json:"time" cbor:"1,keyasint"`
	MemoryKiB uint32 `json:"memoryKiB" cbor:"2,keyasint"`
	Threads   uint8  `json:"threads" cbor:"3,keyasint"`
}

// NoKSF is the identity KSF, for secrets of at least 128 bits.
var NoKSF = KSFParams{}

// CodeKSF is what join codes are stretched with: one pass over 8 MiB in
// one lane. docs/secrets.md derives it from the offline cost of a 50-bit
// code against its lifetime; it keeps a join under 40 ms and a mint under
// 10 ms of CPU.
var CodeKSF = KSFParams{Time: 1, MemoryKiB: 8 * 1024, Threads: 1}

// DefaultKSF is Argon2id as bytemare/ksf defaults it (and RFC 9106's
// second recommendation): 3 passes over 64 MiB with 4 lanes. Codes minted
// before CodeKSF carry it in their records.
var DefaultKSF = KSFParams{Time: 3, MemoryKiB: 64 * 1024, Threads: 4}

// LightestKSF is the cheapest Argon2id setting a listener accepts or an
// agent computes for a join code.
var LightestKSF = CodeKSF

// maxKSFMemoryKiB bounds what a (possibly fake) listener can make an agent
// allocate.
const maxKSFMemoryKiB = 1024 * 1024

// None reports whether p is the identity KSF.
func (p KSFParams) None() bool { return p == NoKSF }

// Check validates the parameters against the accepted bounds; the
// identity KSF is accepted.
func (p KSFParams) Check() error {
	if p.None() {
		return nil
	}
	return p.CheckArgon2id()
}

// CheckArgon2id validates memory-hard parameters: what a join code needs.
func (p KSFParams) CheckArgon2id() error {
	switch {
	case p.Time < LightestKSF.Time || p.Time > 16:
		return fmt.Errorf("argon2id time %d outside %d..16", p.Time, LightestKSF.Time)
	case p.MemoryKiB < LightestKSF.MemoryKiB || p.MemoryKiB > maxKSFMemoryKiB:
		return fmt.Errorf("argon2id memory %d KiB outside %d..%d", p.MemoryKiB, LightestKSF.MemoryKiB, maxKSFMemoryKiB)
	case p.Threads < 1 || p.Threads > 16:
		return fmt.Errorf("argon2id threads %d outside 1..16", p.Threads)
	}
	return nil
}
