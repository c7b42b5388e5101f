// Package cluster is the durable state of a Stratum Join cluster (join
// secrets, nodes, joins, events) and every transaction that changes it.
//
// All of it sits on store.Store, whose only write is a compare-and-swap
// transaction, so the rules that matter for security hold on one bbolt file
// and on an etcd cluster shared by several listeners alike:
//
//   - an attempt is counted in one durable transaction before KE2 leaves,
//     and a start that would take a secret past MaxUnproven burns it instead;
//   - a proven attempt is un-counted, re-checked, matched against `expect`,
//     and consumes a use in one transaction, together with the node record,
//     the identity index and the event.
//
// Secrets themselves are never stored: only their OPAQUE records.
package cluster

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"time"

	"github.com/stratumjoin/stratum/internal/pake"
	"github.com/stratumjoin/stratum/internal/wire"
)

// MaxUnproven is how many started-but-unproven exchanges a secret
// tolerates; the start that would exceed it burns the secret.
const MaxUnproven = 10

// BurnedBy is the revokedBy of a burned secret (the join-codes API, docs/api.md).
const BurnedBy = "system:too-many-attempts"

// CARotatedBy is the revokedBy of a join code that `ca rotate` ended: a
// code's record commits to the root it was minted under.
const CARotatedBy = "system:ca-rotation"

// CARetiredBy is the revokedBy of a secret of any kind whose root `ca
// retire` ended.
const CARetiredBy = "system:ca-retired"

// UsedUpBy is the revokedBy of a join code whose last allowed use was
// spent: the join-codes API knows only live, expired and revoked, and a
// used-up code is revoked at that moment, not listed expired before its
// time. Joins it already holds (pending, or whose Result was lost) go on.
const UsedUpBy = "system:used-up"

// Secret kinds.
const (
	KindCode  = "code"
	KindToken = "token"
	KindKey   = "key"
)

// Roles and trust levels (docs/architecture.md#trust).
const (
	RoleNode       = "node"
	RoleNodeTenant = "node-tenant"

	TrustPlatform         = "platform"
	TrustTenantOwned      = "tenant-owned"
	TrustTenantControlled = "tenant-controlled"
	HostedKubernetes      = "kubernetes"
	DefaultPool           = "default"
	DefaultTenant         = "default"
	SystemActor           = "system"
	stateLive             = "live"
	stateExpired          = "expired"
	stateRevoked          = "revoked"
	stateUsedUp           = "used-up"
	joinPending           = "pending"
	joinApproved          = "approved"
	joinRefused           = "refused"
	joinCompleted         = "completed"
	nodeActive            = "active"
	nodeRevoked           = "revoked"
)

// Expect pins a secret to one machine (the joinTokens API, docs/api.md). Every field given must
// match the claimed facts.
type Expect struct {
	ProductUUID string `json:"productUuid,omitempty"`
	Serial      string `json:"serial,omitempty"`
	MAC         string `json:"mac,omitempty"`
	GPUUUID     string `json:"gpuUuid,omitempty"`
	// EKHash pins the secret to one TPM: the SHA-256 of its endorsement
	// key (docs/tpm.md). Unlike the others it is attested, not claimed.
	EKHash string `json:"ekHash,omitempty"`
}

// Empty reports whether no identifier is given.
func (e *Expect) Empty() bool {
	return e == nil || (e.ProductUUID == "" && e.Serial == "" && e.MAC == "" && e.GPUUUID == "" && e.EKHash == "")
}

// TPMVerdict is what a verified TPM attestation established about a join
// (see internal/tpm): the EK hash, and whether the EK certificate chained
// to the manufacturer roots the listener was given.
type TPMVerdict struct {
	EKHash         string `json:"ekHash"`
	EKCertVerified bool   `json:"ekCertVerified"`
	EKIssuer       string `json:"ekIssuer,omitempty"`
}

// KeyAttrs are what a join key gives the hosts that enroll with it.
type KeyAttrs struct {
	Name      string   `json:"name"`
	OrgID     string   `json:"organizationID"`
	NetworkID string   `json:"networkID"`
	RoleID    string   `json:"roleID,omitempty"`
	Tags      []string `json:"tags"`
	CIDRs     []string `json:"autoAssignCIDRs"`
}

// Secret is the stored record of a join code, token or key. It never holds
// the secret itself.
type Secret struct {
	ID            string         `json:"id"`
	Kind          string         `json:"kind"`
	Locator       string         `json:"locator"`
	Record        []byte         `json:"record"`
	KSF           pake.KSFParams `json:"ksf"`
	CAFingerprint string         `json:"caFingerprint"`
	Endpoint      string         `json:"endpoint"`
	// Endpoints are every endpoint of the cluster when it was minted,
	// Endpoint first; agents fail over from one to the next.
	Endpoints       []string `json:"endpoints,omitempty"`
	Tenant          string   `json:"tenant"`
	Pool            string   `json:"pool"`
	Role            string   `json:"role"`
	Trust           string   `json:"trust"`
	Hosted          string   `json:"hosted,omitempty"`
	Expect          *Expect  `json:"expect,omitempty"`
	AllowReclaim    bool     `json:"allowReclaim,omitempty"`
	RequireApproval bool     `json:"requireApproval,omitempty"`
	MaxUses         int      `json:"maxUses"` // 0: unlimited
	// Description and Labels are the operator's notes on a join code
	// (what batch, which rack); the listener never reads them.
	Description string            `json:"description,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Uses        int               `json:"uses"`
	Unproven    int               `json:"unproven"`
	// FailedReported is the failed-proof count of a token or key last
	// announced by an event; events go out at 1, 2, 4, 8, ... failures,
	// so a guessing storm writes log2(n) of them.
	FailedReported  int        `json:"failedReported,omitempty"`
	Registrations   int        `json:"registrations"`
	CreatedBy       string     `json:"createdBy"`
	CreatedAt       time.Time  `json:"createdAt"`
	ModifiedAt      time.Time  `json:"modifiedAt"`
	ExpiresAt       *time.Time `json:"expiresAt,omitempty"` // nil: never (join keys may omit it)
	RevokedAt       *time.Time `json:"revokedAt,omitempty"`
	RevokedBy       string     `json:"revokedBy,omitempty"`
	Key             *KeyAttrs  `json:"key,omitempty"`
	IdempotencyHash string     `json:"idempotencyHash,omitempty"`
	// Leases are the counted attempts still in flight: their KE3 may yet
	// verify. An expired lease is a failed attempt (it stays counted).
	Leases []Lease `json:"leases,omitempty"`
	// Orphans are the commitments of counted attempts whose proof never
	// came (the listener died, the connection broke, the lease expired).
	// They stay counted until a proof of the code reveals the nonce
	// behind one: only the agent that made the attempt knows it, and only
	// a holder of the code can send a proof (docs/store.md).
	Orphans []Orphan `json:"orphans,omitempty"`
	// Refunded are the last commitments refunded.
	Refunded []string `json:"refunded,omitempty"`
	// AddressesUsed counts addresses handed out per CIDR (join keys).
	// Deprecated: addresses are counted per network (addr/<network>/<cidr>)
	// so that two keys of one network never hand out the same address.
	AddressesUsed map[string]uint64 `json:"addressesUsed,omitempty"`
	// Index holds extra store keys that point at this secret (listing by
	// tenant and pool, or by organization); Mint creates them with the
	// secret and DeleteSecret removes them.
	Index []string `json:"index,omitempty"`
}

// State is live, expired, revoked or used-up at now.
func (s *Secret) State(now time.Time) string {
	switch {
	case s.RevokedAt != nil:
		return stateRevoked
	case s.ExpiresAt != nil && !now.Before(*s.ExpiresAt):
		return stateExpired
	case s.MaxUses > 0 && s.Uses >= s.MaxUses:
		return stateUsedUp
	}
	return stateLive
}

// Live reports whether the secret can still start a join.
func (s *Secret) Live(now time.Time) bool { return s.State(now) == stateLive }

// Burned reports whether the secret was revoked for too many attempts.
func (s *Secret) Burned() bool { return s.RevokedBy == BurnedBy }

// Burns reports whether the failure limit applies: to join codes only. A
// token or key holds at least 128 bits nobody can guess online, and a burn
// rule on it would only be a lever for denial of service; its failed
// proofs are counted and announced instead.
func (s *Secret) Burns() bool { return s.Kind == KindCode }

// usedUp reports whether a code's last allowed use is spent.
func (s *Secret) usedUp() bool {
	return s.RevokedBy == UsedUpBy || s.MaxUses > 0 && s.Uses >= s.MaxUses
}

// Lease marks one counted attempt in flight.
type Lease struct {
	ID    string    `json:"id"`
	Until time.Time `json:"until"`
	// Commit is the agent's commitment for this attempt: hex SHA-256 of a
	// nonce only the agent knows (see Orphans).
	Commit string `json:"commit,omitempty"`
	// Guess names the password guess of the attempt (pake.GuessOf its
	// KE1): a start that repeats it resumes this attempt.
	Guess string `json:"guess,omitempty"`
}

// Orphan is a counted attempt whose proof never came.
type Orphan struct {
	Commit string `json:"commit,omitempty"`
	Guess  string `json:"guess,omitempty"`
}

// liveLeases drops expired leases; the commitments of those that carried
// one become orphans, refundable to whoever reveals the nonce.
func (s *Secret) liveLeases(now time.Time) {
	kept := s.Leases[:0]
	for _, l := range s.Leases {
		if now.Before(l.Until) {
			kept = append(kept, l)
		} else if l.Commit != "" || l.Guess != "" {
			s.Orphans = append(s.Orphans, Orphan{l.Commit, l.Guess})
		}
	}
	s.Leases = kept
}

// dropLease ends a lease; orphan keeps its commitment refundable (the
// proof never came), otherwise it is forgotten (the proof failed, or the
// attempt was proven).
func (s *Secret) dropLease(id string, orphan bool) {
	kept := s.Leases[:0]
	for _, l := range s.Leases {
		if l.ID != id {
			kept = append(kept, l)
		} else if orphan && (l.Commit != "" || l.Guess != "") {
			s.Orphans = append(s.Orphans, Orphan{l.Commit, l.Guess})
		}
	}
	s.Leases = kept
}

// knownCommit reports whether c is held by a lease, an orphan or a
// refund already made: such a commitment is not stored again, so no
// commitment ever stands for two counted attempts.
func (s *Secret) knownCommit(c string) bool {
	for _, l := range s.Leases {
		if l.Commit == c {
			return true
		}
	}
	return slices.ContainsFunc(s.Orphans, func(o Orphan) bool { return o.Commit == c }) || slicesContains(s.Refunded, c)
}

// MaxRefundsPerProof bounds the nonces one Proof may reveal.
const MaxRefundsPerProof = 16

// maxRefundedKept is how many refunded commitments a secret remembers,
// so a nonce revealed again (its Result was lost) refunds nothing.
const maxRefundedKept = 64

// refund gives back at most one counted attempt per nonce whose
// commitment is an orphan or a lease of s, and reports how many it gave back. Every
// orphan with that commitment is removed, so a commitment copied by a
// guesser never refunds more than the one attempt of its owner.
func (s *Secret) refund(nonces [][]byte) int {
	n := 0
	for i, nonce := range nonces {
		if i == MaxRefundsPerProof || len(nonce) != AttemptNonceSize {
			break
		}
		c := CommitOf(nonce)
		// a lease still in flight counts too: its owner is proving on
		// another connection, so that one will never finish
		leased := slices.ContainsFunc(s.Leases, func(l Lease) bool { return l.Commit == c })
		orphaned := slices.ContainsFunc(s.Orphans, func(o Orphan) bool { return o.Commit == c })
		if !leased && !orphaned {
			continue
		}
		s.Leases = slices.DeleteFunc(s.Leases, func(l Lease) bool { return l.Commit == c })
		s.Orphans = slices.DeleteFunc(s.Orphans, func(o Orphan) bool { return o.Commit == c })
		s.Refunded = append(s.Refunded, c)
		if len(s.Refunded) > maxRefundedKept {
			s.Refunded = s.Refunded[len(s.Refunded)-maxRefundedKept:]
		}
		if s.Unproven > 0 {
			s.Unproven--
			n++
		}
	}
	return n
}

// AttemptNonceSize is the size of an agent's attempt nonce.
const AttemptNonceSize = 32

// CommitOf is the commitment to an attempt nonce: hex SHA-256.
func CommitOf(nonce []byte) string {
	h := sha256.Sum256(nonce)
	return hex.EncodeToString(h[:])
}

// Node is a joined machine.
type Node struct {
	ID          string     `json:"id"`
	Pool        string     `json:"pool"`
	Tenant      string     `json:"tenant"`
	IdentityKey string     `json:"identityKey"`
	Facts       Facts      `json:"facts"`
	Role        string     `json:"role"`
	Trust       string     `json:"trust"`
	SecretID    string     `json:"secretId"`
	JoinID      string     `json:"joinId"`
	KeyFP       string     `json:"keyFingerprint"`
	CertSerial  string     `json:"certSerial"`
	NotAfter    time.Time  `json:"notAfter"`
	State       string     `json:"state"`
	JoinedAt    time.Time  `json:"joinedAt"`
	RenewedAt   *time.Time `json:"renewedAt,omitempty"`
	RevokedAt   *time.Time `json:"revokedAt,omitempty"`
	RevokedBy   string     `json:"revokedBy,omitempty"`
	// RevokedSerials are earlier certificates of this node id that were
	// revoked by a reclaim; renewals with them are refused.
	RevokedSerials []string `json:"revokedSerials,omitempty"`
	// Generation counts the reclaims of this node id; certificates issued
	// in an earlier generation no longer renew (see serialOwner).
	Generation int   `json:"generation,omitempty"`
	Host       *Host `json:"host,omitempty"`
	// TPM is set when the node key was attested to live in a TPM; such
	// a node renews only with that key.
	TPM *TPMVerdict `json:"tpm,omitempty"`
}

// Join is one proven join of a key with a secret: pending approval,
// approved, refused or completed. A reconnect with the same key finds it.
type Join struct {
	ID        string     `json:"id"`
	SecretID  string     `json:"secretId"`
	KeyFP     string     `json:"keyFingerprint"`
	Facts     Facts      `json:"facts"`
	State     string     `json:"state"`
	NodeID    string     `json:"nodeId,omitempty"`
	Pool      string     `json:"pool"`
	CreatedAt time.Time  `json:"createdAt"`
	DecidedAt *time.Time `json:"decidedAt,omitempty"`
	DecidedBy string     `json:"decidedBy,omitempty"`
	// SAS is the short authentication string of the PAKE session that
	// made (or last resumed) this join: six digits the agent prints and
	// an approver compares at the machine. It is no secret.
	SAS string `json:"sas,omitempty"`
}

// Facts are what a machine claimed at join, as stored: the store's own
// type, so a change to the wire protocol never silently changes the
// records listeners of two versions share.
type Facts struct {
	ProductUUID string   `json:"productUuid,omitempty"`
	Serial      string   `json:"serial,omitempty"`
	BoardSerial string   `json:"boardSerial,omitempty"`
	Vendor      string   `json:"vendor,omitempty"`
	ProductName string   `json:"productName,omitempty"`
	MACs        []string `json:"macs,omitempty"`
	GPUUUIDs    []string `json:"gpuUuids,omitempty"`
	Hostname    string   `json:"hostname,omitempty"`
}

func factsFrom(f wire.Facts) Facts {
	return Facts{ProductUUID: f.ProductUUID, Serial: f.Serial, BoardSerial: f.BoardSerial, Vendor: f.Vendor,
		ProductName: f.ProductName, MACs: f.MACs, GPUUUIDs: f.GPUUUIDs, Hostname: f.Hostname}
}

// Wire is f as the protocol carries it.
func (f Facts) Wire() wire.Facts {
	return wire.Facts{ProductUUID: f.ProductUUID, Serial: f.Serial, BoardSerial: f.BoardSerial, Vendor: f.Vendor,
		ProductName: f.ProductName, MACs: f.MACs, GPUUUIDs: f.GPUUUIDs, Hostname: f.Hostname}
}

// Host is what a join key assigned a node, as stored.
type Host struct {
	Name      string   `json:"name"`
	NetworkID string   `json:"networkID"`
	RoleID    string   `json:"roleID,omitempty"`
	Tags      []string `json:"tags,omitempty"`
	Addresses []string `json:"addresses,omitempty"`
}

// Wire is h as a Result carries it; nil for no host.
func (h *Host) Wire() *wire.Host {
	if h == nil {
		return nil
	}
	return &wire.Host{Name: h.Name, NetworkID: h.NetworkID, RoleID: h.RoleID, Tags: h.Tags, Addresses: h.Addresses}
}

// Event is one durable, ordered record of something that happened.
type Event struct {
	Seq    string         `json:"seq"`
	Type   string         `json:"type"`
	Time   time.Time      `json:"time"`
	Actor  string         `json:"actor,omitempty"`
	Fields map[string]any `json:"fields,omitempty"`
}

// Event types.
const (
	EventTokenCreated     = "security.join-token.created"
	EventTokenRevoked     = "security.join-token.revoked"
	EventCodeCreated      = "security.join-code.created"
	EventCodeRevoked      = "security.join-code.revoked"
	EventKeyCreated       = "security.join-key.created"
	EventKeyDeleted       = "security.join-key.deleted"
	EventSecretBurned     = "security.join-code.burned"
	EventTokenFailed      = "security.join-token.failed-attempts"
	EventKeyFailed        = "security.join-key.failed-attempts"
	EventNodeJoined       = "node.joined"
	EventNodeReclaimed    = "node.reclaimed"
	EventNodeRevoked      = "node.revoked"
	EventNodeRenewed      = "node.renewed"
	EventJoinRefused      = "join.refused"
	EventJoinPending      = "join.pending"
	EventJoinApproved     = "join.approved"
	EventJoinRefusedAdmin = "join.approval-refused"
	EventCARotated        = "ca.rotated"
	EventCARetired        = "ca.retired"
	EventKeyRevoked       = "security.join-key.revoked"
	EventAttemptsRefunded = "security.join-code.attempts-refunded"
	EventAttemptsReset    = "security.join-code.attempts-reset"
)
