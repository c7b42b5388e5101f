package cluster

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/stratumjoin/stratum/internal/identity"
	"github.com/stratumjoin/stratum/internal/wire"
)

// ExpectProblem is one reason an `expect` binding cannot be minted.
type ExpectProblem struct {
	// Field is the expect field at fault ("productUuid", "serial", "mac",
	// "gpuUuid"), or "" when the binding as a whole is.
	Field   string
	Message string
}

// expectRule is the joinTokens API's constraint on one `expect` field, with the
// sentence an operator reads when a value breaks it.
type expectRule struct {
	field string
	max   int
	re    *regexp.Regexp
	want  string
}

var expectRules = []expectRule{
	{identity.KindProductUUID, 64, regexp.MustCompile(`^[0-9A-Fa-f-]{8,64}$`),
		"must be the SMBIOS product UUID: 8-64 hex digits and dashes, like 4C4C4544-0037-5810-804A-B2C04F4B5133 (see /sys/class/dmi/id/product_uuid or `stratum-agent hwid`)"},
	{identity.KindSerial, 128, regexp.MustCompile(`^[A-Za-z0-9._:/+-]{1,128}$`),
		"must be the system serial: 1-128 letters, digits and . _ : / + - (no spaces), like 7XJ2KQ3"},
	{identity.KindMAC, 17, regexp.MustCompile(`^[0-9A-Fa-f]{2}(?::[0-9A-Fa-f]{2}){5}$`),
		"must be a MAC address written as six colon-separated hex pairs, like 3c:ec:ef:a1:b2:c3"},
	{identity.KindGPUUUID, 68, regexp.MustCompile(`^GPU-[0-9A-Fa-f-]{8,64}$`),
		`must be "GPU-" followed by 8-64 hex digits and dashes, as nvidia-smi -L prints it`},
}

// FieldEKHash is the expect field that pins a TPM.
const FieldEKHash = "ekHash"

var ekHashRE = regexp.MustCompile(`^[0-9A-Fa-f]{64}$`)

// MismatchedTPM reports whether e pins a TPM the attestation (nil: none)
// does not prove.
func MismatchedTPM(e *Expect, v *TPMVerdict) bool {
	return e != nil && e.EKHash != "" && (v == nil || !strings.EqualFold(e.EKHash, v.EKHash))
}

func (e *Expect) value(field string) string {
	switch field {
	case identity.KindProductUUID:
		return e.ProductUUID
	case identity.KindSerial:
		return e.Serial
	case identity.KindMAC:
		return e.MAC
	case identity.KindGPUUUID:
		return e.GPUUUID
	}
	return ""
}

// Validate checks e as the joinTokens API constrains it: every field given matches
// its pattern and is no firmware placeholder (docs/architecture.md#identity: those
// are never identities), and at least one identifier is given. A nil e is
// no binding at all, which is valid.
func (e *Expect) Validate() []ExpectProblem {
	if e == nil {
		return nil
	}
	var probs []ExpectProblem
	for _, r := range expectRules {
		v := e.value(r.field)
		if v == "" {
			continue
		}
		if len(v) > r.max {
			probs = append(probs, ExpectProblem{r.field, fmt.Sprintf("is %d characters (at most %d); it %s", len(v), r.max, r.want)})
			continue
		}
		if !r.re.MatchString(v) {
			probs = append(probs, ExpectProblem{r.field, r.want})
			continue
		}
		if reason := identity.PlaceholderReason(r.field, v); reason != "" {
			probs = append(probs, ExpectProblem{r.field, "is " + reason + ", a value many machines share or none owns: it cannot pin one machine"})
		}
	}
	if e.EKHash != "" && !ekHashRE.MatchString(e.EKHash) {
		probs = append(probs, ExpectProblem{FieldEKHash, "must be the SHA-256 of the TPM's endorsement key: 64 hex digits (see `stratum-agent tpm ek` on the machine)"})
	}
	if e.Empty() {
		probs = append(probs, ExpectProblem{"", "must name at least one identifier: productUuid, serial, mac, gpuUuid or ekHash"})
	}
	return probs
}

// MismatchedField names the first `expect` field the facts do not
// satisfy, or "" when every given field matches (the joinTokens API, docs/api.md): UUIDs and MACs
// case-insensitively, MACs and GPU UUIDs as members of the reported sets.
// UUIDs and MACs are compared in canonical form, so a pin written without
// dashes or in capitals still finds the agent's normalised claim.
func MismatchedField(e *Expect, f wire.Facts) string {
	if e == nil {
		return ""
	}
	if e.ProductUUID != "" && identity.NormalizeUUID(e.ProductUUID) != identity.NormalizeUUID(f.ProductUUID) {
		return identity.KindProductUUID
	}
	if e.Serial != "" && e.Serial != f.Serial {
		return identity.KindSerial
	}
	if e.MAC != "" && !hasMember(f.MACs, e.MAC, canonicalMAC) {
		return identity.KindMAC
	}
	if e.GPUUUID != "" && !hasMember(f.GPUUUIDs, e.GPUUUID, canonicalGPUUUID) {
		return identity.KindGPUUUID
	}
	return ""
}

// canonicalMAC is the MAC in lower-case colon form, or v lower-cased when
// it is not a MAC (it then matches only itself, case-insensitively).
func canonicalMAC(v string) string {
	if m, err := identity.NormalizeMAC(v); err == nil {
		return m
	}
	return strings.ToLower(strings.TrimSpace(v))
}

func canonicalGPUUUID(v string) string {
	if g, err := identity.NormalizeGPUUUID(v); err == nil {
		return g
	}
	return strings.ToLower(strings.TrimSpace(v))
}

func hasMember(set []string, v string, canon func(string) string) bool {
	want := canon(v)
	for _, s := range set {
		if canon(s) == want {
			return true
		}
	}
	return false
}

// NodeIdentityKey is the identity a node is indexed by: the attested EK
// hash when the join proved a TPM, else the claimed IdentityKey.
func NodeIdentityKey(v *TPMVerdict, f wire.Facts) string {
	if v != nil && v.EKHash != "" {
		return "ek:" + strings.ToLower(v.EKHash)
	}
	return IdentityKey(f)
}

// IdentityKey is the node identity of docs/architecture.md#identity: the product
// UUID, else the serial, else the MAC set. Placeholder values are never
// identities: an agent that reports one anyway (an old or a hostile one)
// must not make every board with the same firmware template one node.
func IdentityKey(f wire.Facts) string {
	if u := identity.NormalizeUUID(f.ProductUUID); u != "" && !identity.IsPlaceholder(identity.KindProductUUID, u) {
		return "uuid:" + u
	}
	if s := strings.TrimSpace(f.Serial); s != "" && !identity.IsPlaceholder(identity.KindSerial, s) {
		return "serial:" + s
	}
	seen := map[string]bool{}
	var macs []string
	for _, m := range f.MACs {
		mac, err := identity.NormalizeMAC(m)
		if err != nil || seen[mac] || identity.IsPlaceholder(identity.KindMAC, mac) {
			continue
		}
		seen[mac] = true
		macs = append(macs, mac)
	}
	if len(macs) == 0 {
		return ""
	}
	sortStrings(macs)
	return "mac:" + strings.Join(macs, ",")
}
