// Package registry is the listener's declarative inventory: the tenants
// that may mint join secrets, the sites machines stand in, the pools they
// join, and the overlay networks and roles that join keys hand out. It is
// read once, from the file given to `stratum-listener serve --registry`
// (YAML or JSON), and validated strictly: unknown fields, duplicate ids and
// references to anything the file does not define are errors, so a typo
// never silently widens trust.
//
// A registry also decides trust (docs/architecture.md#trust): see Registry.Trust.
//
// Example:
//
//	tenants:
//	  - id: acme
//	    limits: {joinKeys: 50, requestsPerSecond: 5, burst: 10}
//	sites:
//	  - {id: fra1, owner: platform}
//	  - {id: acme-dc, owner: acme}
//	pools:
//	  - id: gpu-a
//	    tenant: acme
//	    site: fra1
//	    agent: bcd
//	    policy: {kubernetes: {platformOperated: true}}
//	networks:
//	  - {id: net-1, tenant: acme, cidr: 100.100.0.0/22, ipv6Prefix: "fdef:c0:c0:1::/80"}
//	roles:
//	  - {id: role-ci, tenant: acme}
package registry

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"regexp"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/stratumjoin/stratum/internal/cluster"
	"github.com/stratumjoin/stratum/internal/strictjson"
)

// PlatformOwner is the owner of a site the platform runs.
const PlatformOwner = "platform"

// AgentBCD is the agent kind of pools whose machines run the Stratum
// agent daemon; only such pools take join tokens (the joinTokens API, docs/api.md).
const AgentBCD = "bcd"

// Defaults for a tenant's limits.
const (
	DefaultJoinKeyLimit      = 100
	DefaultRequestsPerSecond = 10
	DefaultBurst             = 20
)

// Registry is the whole inventory.
type Registry struct {
	Tenants  []Tenant  `json:"tenants"`
	Sites    []Site    `json:"sites"`
	Pools    []Pool    `json:"pools"`
	Networks []Network `json:"networks,omitempty"`
	Roles    []Role    `json:"roles,omitempty"`
	// OpenPools, set only on the default registry, makes every pool name
	// a pool of the default tenant on the default platform site, so a
	// listener started without a registry file takes `codes create
	// --pool NAME` as it always did.
	OpenPools bool `json:"openPools,omitempty"`
}

// Tenant is an owner of pools, networks and roles; for join keys (seed
// 003) it is the organization.
type Tenant struct {
	ID     string `json:"id"`
	Limits Limits `json:"limits"`
}

// Limits bound what a tenant may hold and how fast it may call.
type Limits struct {
	// JoinKeys is how many join keys the organization may hold.
	JoinKeys int `json:"joinKeys,omitempty"`
	// RequestsPerSecond and Burst shape the organization's rate limit on
	// the join-keys API.
	RequestsPerSecond float64 `json:"requestsPerSecond,omitempty"`
	Burst             int     `json:"burst,omitempty"`
}

// Site is where machines stand: the platform's own (owner "platform") or
// a tenant's. A custom site is one the platform does not vouch for, even
// when it owns it.
type Site struct {
	ID     string `json:"id"`
	Owner  string `json:"owner"`
	Custom bool   `json:"custom,omitempty"`
}

// Pool is a set of machines of one tenant on one site.
type Pool struct {
	ID     string     `json:"id"`
	Tenant string     `json:"tenant"`
	Site   string     `json:"site"`
	Agent  string     `json:"agent"`
	Policy PoolPolicy `json:"policy"`
}

// PoolPolicy is a pool's policy document.
type PoolPolicy struct {
	Kubernetes KubernetesPolicy `json:"kubernetes"`
	// RequireTPM refuses joins into the pool that do not prove their node
	// key lives in a TPM (JOIN_TPM_REQUIRED; see docs/tpm.md).
	RequireTPM bool `json:"requireTPM,omitempty"`
}

// KubernetesPolicy governs tokens with hosted: kubernetes.
type KubernetesPolicy struct {
	// PlatformOperated says the platform runs this pool's Kubernetes
	// clusters, so a DaemonSet agent keeps platform trust (only on a
	// platform-owned, non-custom site).
	PlatformOperated bool `json:"platformOperated"`
}

// Network is an overlay network a join key enrolls hosts into.
type Network struct {
	ID         string `json:"id"`
	Tenant     string `json:"tenant"`
	CIDR       string `json:"cidr"`
	IPv6Prefix string `json:"ipv6Prefix,omitempty"`
}

// Role is a role a join key may give its hosts.
type Role struct {
	ID     string `json:"id"`
	Tenant string `json:"tenant"`
}

// Default is the registry a listener uses when none is given: one tenant,
// one platform site and one pool, all named "default", and any other pool
// name taken as a pool of that tenant on that site (OpenPools), so that
// `codes create` works out of the box.
func Default() *Registry {
	r := &Registry{
		OpenPools: true,
		Tenants:   []Tenant{{ID: cluster.DefaultTenant}},
		Sites:     []Site{{ID: "default", Owner: PlatformOwner}},
		Pools:     []Pool{{ID: cluster.DefaultPool, Tenant: cluster.DefaultTenant, Site: "default", Agent: AgentBCD}},
	}
	if err := r.validate(); err != nil {
		panic("registry: default registry is invalid: " + err.Error())
	}
	return r
}

// Load reads and validates a registry file (YAML or JSON).
func Load(path string) (*Registry, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read registry: %w", err)
	}
	r, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("registry %s: %w", path, err)
	}
	return r, nil
}

// Parse decodes and validates a registry document: JSON when it starts
// with "{", else YAML. Unknown fields, duplicate keys and a second document
// are errors.
func Parse(doc []byte) (*Registry, error) {
	j := bytes.TrimSpace(doc)
	if !bytes.HasPrefix(j, []byte("{")) {
		if multiDocument(doc) {
			return nil, errors.New("parse: more than one YAML document")
		}
		var err error
		if j, err = yaml.YAMLToJSONStrict(doc); err != nil {
			return nil, fmt.Errorf("parse: %w", err)
		}
	}
	var r Registry
	if err := strictjson.Unmarshal(j, &r); err != nil {
		return nil, fmt.Errorf("parse: %w", err)
	}
	if r.OpenPools {
		return nil, errors.New("openPools belongs to the default registry only: declare every pool")
	}
	if err := r.validate(); err != nil {
		return nil, err
	}
	return &r, nil
}

// multiDocument reports a YAML document separator after the first line
// of content, which would otherwise silently drop every document but the
// first.
func multiDocument(doc []byte) bool {
	content := false
	for _, line := range strings.Split(string(doc), "\n") {
		t := strings.TrimRight(line, " \t\r")
		if content && (t == "---" || t == "..." || strings.HasPrefix(t, "--- ")) {
			return true
		}
		if t != "" && t != "---" && !strings.HasPrefix(strings.TrimSpace(t), "#") {
			content = true
		}
	}
	return false
}

var (
	// TenantIDRE and PoolIDRE are the joinTokens API's tenantId and poolId; the
	// admin API checks requests with them too.
	TenantIDRE = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,128}$`)
	PoolIDRE   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$`)
	tenantRE   = TenantIDRE
	poolRE     = PoolIDRE
	idRE       = PoolIDRE
	agentRE    = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,31}$`)
)

func (r *Registry) validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	// define checks an id and records it, once per kind
	define := func(kind string, set map[string]bool, i int, id string, re *regexp.Regexp) {
		switch {
		case !re.MatchString(id):
			bad("%s[%d].id %q must match %s", kind, i, id, re)
		case set[id]:
			bad("%s[%d].id %q is defined twice", kind, i, id)
		}
		set[id] = true
	}
	tenants := map[string]bool{}
	for i, t := range r.Tenants {
		if t.ID == PlatformOwner {
			bad("tenants[%d].id %q is reserved for the platform", i, t.ID)
		}
		define("tenants", tenants, i, t.ID, tenantRE)
		l := &r.Tenants[i].Limits
		if l.JoinKeys < 0 || l.RequestsPerSecond < 0 || l.Burst < 0 {
			bad("tenants[%d].limits must not be negative", i)
		}
		l.JoinKeys = cmp.Or(l.JoinKeys, DefaultJoinKeyLimit)
		l.RequestsPerSecond = cmp.Or(l.RequestsPerSecond, DefaultRequestsPerSecond)
		l.Burst = cmp.Or(l.Burst, DefaultBurst)
	}
	sites := map[string]bool{}
	for i, s := range r.Sites {
		define("sites", sites, i, s.ID, idRE)
		if s.Owner != PlatformOwner && !tenants[s.Owner] {
			bad("sites[%d].owner %q is neither %q nor a tenant", i, s.Owner, PlatformOwner)
		}
	}
	pools := map[string]bool{}
	for i, p := range r.Pools {
		define("pools", pools, i, p.ID, poolRE)
		if !tenants[p.Tenant] {
			bad("pools[%d].tenant %q is not a tenant", i, p.Tenant)
		}
		if !sites[p.Site] {
			bad("pools[%d].site %q is not a site", i, p.Site)
		}
		if !agentRE.MatchString(p.Agent) {
			bad("pools[%d].agent %q must match %s (bcd for machines that run the Stratum agent)", i, p.Agent, agentRE)
		}
	}
	networks := map[string]bool{}
	for i, n := range r.Networks {
		define("networks", networks, i, n.ID, idRE)
		if !tenants[n.Tenant] {
			bad("networks[%d].tenant %q is not a tenant", i, n.Tenant)
		}
		if err := checkPrefix(n.CIDR, true); err != nil {
			bad("networks[%d].cidr: %w", i, err)
		}
		if n.IPv6Prefix != "" {
			if err := checkPrefix(n.IPv6Prefix, false); err != nil {
				bad("networks[%d].ipv6Prefix: %w", i, err)
			}
		}
	}
	roles := map[string]bool{}
	for i, ro := range r.Roles {
		switch {
		case !idRE.MatchString(ro.ID):
			bad("roles[%d].id %q must match %s", i, ro.ID, idRE)
		case roles[ro.ID]:
			bad("roles[%d].id %q is defined twice", i, ro.ID)
		}
		roles[ro.ID] = true
		if !tenants[ro.Tenant] {
			bad("roles[%d].tenant %q is not a tenant", i, ro.Tenant)
		}
	}
	return errors.Join(errs...)
}

// checkPrefix insists on a canonical prefix of the right family, so that
// the join-keys API can compare autoAssignCIDRs with it exactly.
func checkPrefix(s string, v4 bool) error {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return fmt.Errorf("%q is not a CIDR prefix", s)
	}
	switch {
	case v4 && !p.Addr().Is4():
		return fmt.Errorf("%q is not an IPv4 prefix", s)
	case !v4 && (!p.Addr().Is6() || p.Addr().Is4In6()):
		return fmt.Errorf("%q is not an IPv6 prefix", s)
	case p.Masked() != p || p.String() != s:
		return fmt.Errorf("%q is not canonical: write %s", s, p.Masked())
	case p.Addr().BitLen()-p.Bits() < 2:
		return fmt.Errorf("%q leaves no host addresses", s)
	}
	return nil
}

// Tenant returns the tenant with id.
func (r *Registry) Tenant(id string) (Tenant, bool) {
	return find(r.Tenants, id, func(t Tenant) string { return t.ID })
}

// Site returns the site with id.
func (r *Registry) Site(id string) (Site, bool) {
	return find(r.Sites, id, func(s Site) string { return s.ID })
}

// Pool returns the pool with id; on an open registry any valid pool id
// names a pool of the default tenant on the default site.
func (r *Registry) Pool(id string) (Pool, bool) {
	p, ok := find(r.Pools, id, func(p Pool) string { return p.ID })
	if !ok && r.OpenPools && poolRE.MatchString(id) {
		return Pool{ID: id, Tenant: cluster.DefaultTenant, Site: "default", Agent: AgentBCD}, true
	}
	return p, ok
}

// Network returns the network with id.
func (r *Registry) Network(id string) (Network, bool) {
	return find(r.Networks, id, func(n Network) string { return n.ID })
}

// Role returns the role with id.
func (r *Registry) Role(id string) (Role, bool) {
	return find(r.Roles, id, func(ro Role) string { return ro.ID })
}

// DefaultTenant is the tenant the bootstrap admin acts for where an API
// needs one and the request cannot name it (the join-keys API): the
// tenant "default" when there is one, else the first tenant.
func (r *Registry) DefaultTenant() (Tenant, bool) {
	if t, ok := r.Tenant(cluster.DefaultTenant); ok {
		return t, true
	}
	if len(r.Tenants) > 0 {
		return r.Tenants[0], true
	}
	return Tenant{}, false
}

func find[T any](items []T, id string, key func(T) string) (T, bool) {
	for _, it := range items {
		if key(it) == id {
			return it, true
		}
	}
	var zero T
	return zero, false
}

// Trust decides the role and trust of a node joining pool with a secret
// that is or is not hosted on Kubernetes (docs/architecture.md#trust, the joinTokens API):
//
//   - a pool on a tenant's own site is tenant-owned, hosted or not: a
//     hosted secret only ever lowers platform trust;
//   - a pool on a platform site is platform, unless the secret is hosted:
//     then the node is tenant-controlled with a node-tenant certificate,
//     except on a pool whose policy says platformOperated and which the
//     platform owns on a site that is not custom.
//
// The secret decides, never the machine's claims.
func (r *Registry) Trust(p Pool, hosted string) (role, trust string) {
	site, _ := r.Site(p.Site)
	if site.Owner != PlatformOwner {
		if hosted == cluster.HostedKubernetes {
			return cluster.RoleNodeTenant, cluster.TrustTenantOwned
		}
		return cluster.RoleNode, cluster.TrustTenantOwned
	}
	if hosted != cluster.HostedKubernetes {
		return cluster.RoleNode, cluster.TrustPlatform
	}
	if p.Policy.Kubernetes.PlatformOperated && !site.Custom {
		return cluster.RoleNode, cluster.TrustPlatform
	}
	return cluster.RoleNodeTenant, cluster.TrustTenantControlled
}

// Summary is a one-line description for logs.
func (r *Registry) Summary() string {
	return fmt.Sprintf("%d tenants, %d sites, %d pools, %d networks, %d roles", len(r.Tenants), len(r.Sites), len(r.Pools), len(r.Networks), len(r.Roles))
}
