package registry_test

import (
	"errors"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stratumjoin/stratum/listener/registry"
)

// TestExampleLoads: the README's example (testdata/example.yaml) loads,
// with the limits it leaves out filled in.
func TestExampleLoads(t *testing.T) {
	reg, err := registry.Load(filepath.Join("testdata", "example.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	acme, ok := reg.Tenant("acme")
	if !ok || acme.Limits.JoinKeys != 50 || acme.Limits.RequestsPerSecond != 5 || acme.Limits.Burst != 10 {
		t.Errorf("acme %+v", acme)
	}
	globex, _ := reg.Tenant("globex")
	if globex.Limits != (registry.Limits{JoinKeys: registry.DefaultJoinKeyLimit, RequestsPerSecond: registry.DefaultRequestsPerSecond, Burst: registry.DefaultBurst}) {
		t.Errorf("defaults %+v", globex.Limits)
	}
	if p, ok := reg.Pool("gpu-k8s"); !ok || !p.Policy.Kubernetes.PlatformOperated || p.Agent != "bcd" {
		t.Errorf("pool %+v", p)
	}
	if n, ok := reg.Network("network-acme-prod"); !ok || n.IPv6Prefix != "fdef:c0:c0:1::/80" {
		t.Errorf("network %+v", n)
	}
	// the doc comment's example is the same document in short form
	if _, err := registry.Parse([]byte(docExample)); err != nil {
		t.Errorf("package doc example: %v", err)
	}
}

const docExample = `
tenants:
  - id: acme
    limits: {joinKeys: 50, requestsPerSecond: 5, burst: 10}
sites:
  - {id: fra1, owner: platform}
  - {id: acme-dc, owner: acme}
pools:
  - id: gpu-a
    tenant: acme
    site: fra1
    agent: bcd
    policy: {kubernetes: {platformOperated: true}}
networks:
  - {id: net-1, tenant: acme, cidr: 100.100.0.0/22, ipv6Prefix: "fdef:c0:c0:1::/80"}
roles:
  - {id: role-ci, tenant: acme}
`

// TestParseRejects: strict decoding and every reference checked.
func TestParseRejects(t *testing.T) {
	base := func(extra string) string {
		return "tenants: [{id: acme}]\nsites: [{id: s1, owner: platform}]\npools: [{id: p1, tenant: acme, site: s1, agent: bcd}]\n" + extra
	}
	cases := []struct {
		name, doc, want string
	}{
		{"unknown top-level field", base("zones: []"), "member zones is not known"},
		{"unknown nested field", "tenants: [{id: acme, quota: 3}]", "member tenants[0].quota is not known"},
		{"unknown policy field", "tenants: [{id: acme}]\nsites: [{id: s1, owner: platform}]\npools: [{id: p1, tenant: acme, site: s1, agent: bcd, policy: {kubernetes: {platformOwned: true}}}]", "member pools[0].policy.kubernetes.platformOwned is not known"},
		{"duplicate yaml key", "tenants: []\ntenants: []", "already set"},
		{"two documents", `{"tenants":[]} {"tenants":[]}`, "parse"},
		{"not yaml", "tenants: [", "parse"},
		{"two yaml documents", "tenants: [{id: a}]\n---\ntenants: [{id: b}]\n", "more than one"},
		{"yaml boolean as an id", "tenants: [{id: no}]", "tenants[0].id must be a string"},
		{"duplicate tenant", "tenants: [{id: a}, {id: a}]", "defined twice"},
		{"tenant named platform", "tenants: [{id: platform}]", "reserved"},
		{"bad tenant id", "tenants: [{id: 'a b'}]", "must match"},
		{"negative limit", "tenants: [{id: a, limits: {joinKeys: -1}}]", "negative"},
		{"site owner unknown", "tenants: [{id: a}]\nsites: [{id: s, owner: b}]", "neither"},
		{"duplicate site", "tenants: [{id: a}]\nsites: [{id: s, owner: a}, {id: s, owner: a}]", "defined twice"},
		{"pool dangling tenant", "tenants: [{id: a}]\nsites: [{id: s, owner: platform}]\npools: [{id: p, tenant: b, site: s, agent: bcd}]", "not a tenant"},
		{"pool dangling site", "tenants: [{id: a}]\nsites: [{id: s, owner: platform}]\npools: [{id: p, tenant: a, site: t, agent: bcd}]", "not a site"},
		{"pool without agent", "tenants: [{id: a}]\nsites: [{id: s, owner: platform}]\npools: [{id: p, tenant: a, site: s}]", "agent"},
		{"pool bad id", "tenants: [{id: a}]\nsites: [{id: s, owner: platform}]\npools: [{id: -p, tenant: a, site: s, agent: bcd}]", "must match"},
		{"duplicate pool", "tenants: [{id: a}]\nsites: [{id: s, owner: platform}]\npools: [{id: p, tenant: a, site: s, agent: bcd}, {id: p, tenant: a, site: s, agent: bcd}]", "defined twice"},
		{"network dangling tenant", base("networks: [{id: net1, tenant: b, cidr: 10.0.0.0/24}]"), "not a tenant"},
		{"network bad cidr", base("networks: [{id: net1, tenant: acme, cidr: 10.0.0.0/33}]"), "not a CIDR"},
		{"network cidr not canonical", base("networks: [{id: net1, tenant: acme, cidr: 10.0.0.1/24}]"), "not canonical"},
		{"network cidr is ipv6", base("networks: [{id: net1, tenant: acme, cidr: 'fd00::/64'}]"), "not an IPv4"},
		{"network ipv6Prefix is ipv4", base("networks: [{id: net1, tenant: acme, cidr: 10.0.0.0/24, ipv6Prefix: 10.1.0.0/24}]"), "not an IPv6"},
		{"network without hosts", base("networks: [{id: net1, tenant: acme, cidr: 10.0.0.0/31}]"), "no host"},
		{"duplicate network", base("networks: [{id: net1, tenant: acme, cidr: 10.0.0.0/24}, {id: net1, tenant: acme, cidr: 10.1.0.0/24}]"), "defined twice"},
		{"role dangling tenant", base("roles: [{id: r1, tenant: b}]"), "not a tenant"},
		{"open pools in a file", base("openPools: true"), "default registry only"},
		{"duplicate role", base("roles: [{id: r1, tenant: acme}, {id: r1, tenant: acme}]"), "defined twice"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := registry.Parse([]byte(c.doc))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one containing %q", err, c.want)
			}
		})
	}
	for _, ok := range []string{base(""), "# a registry\n---\n" + base(""), "{\"tenants\": [{\"id\": \"a\"}]}\n"} {
		if _, err := registry.Parse([]byte(ok)); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
}

// TestTrust walks docs/architecture.md#trust: hosted only lowers platform trust,
// platformOperated keeps it only on a platform-owned, non-custom site, and
// a tenant's own site stays tenant-owned.
func TestTrust(t *testing.T) {
	reg, err := registry.Parse([]byte(`
tenants: [{id: acme}]
sites:
  - {id: plat, owner: platform}
  - {id: plat-custom, owner: platform, custom: true}
  - {id: own, owner: acme}
pools:
  - {id: plain, tenant: acme, site: plat, agent: bcd}
  - {id: operated, tenant: acme, site: plat, agent: bcd, policy: {kubernetes: {platformOperated: true}}}
  - {id: operated-custom, tenant: acme, site: plat-custom, agent: bcd, policy: {kubernetes: {platformOperated: true}}}
  - {id: own-operated, tenant: acme, site: own, agent: bcd, policy: {kubernetes: {platformOperated: true}}}
`))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct{ pool, hosted, role, trust string }{
		{"plain", "", "node", "platform"},
		{"plain", "kubernetes", "node-tenant", "tenant-controlled"},
		{"operated", "", "node", "platform"},
		{"operated", "kubernetes", "node", "platform"},
		{"operated-custom", "", "node", "platform"},
		{"operated-custom", "kubernetes", "node-tenant", "tenant-controlled"},
		{"own-operated", "", "node", "tenant-owned"},
		{"own-operated", "kubernetes", "node-tenant", "tenant-owned"},
	}
	for _, c := range cases {
		p, _ := reg.Pool(c.pool)
		role, trust := reg.Trust(p, c.hosted)
		if role != c.role || trust != c.trust {
			t.Errorf("%s hosted=%q: %s/%s, want %s/%s", c.pool, c.hosted, role, trust, c.role, c.trust)
		}
	}
}

func TestDefault(t *testing.T) {
	reg := registry.Default()
	p, ok := reg.Pool("default")
	if !ok || p.Agent != registry.AgentBCD || p.Tenant != "default" {
		t.Fatalf("default pool %+v", p)
	}
	if role, trust := reg.Trust(p, ""); role != "node" || trust != "platform" {
		t.Errorf("default pool trust %s/%s", role, trust)
	}
	if tn, ok := reg.DefaultTenant(); !ok || tn.ID != "default" {
		t.Errorf("default tenant %+v", tn)
	}
	// without a registry file any pool name is a default-tenant pool on the
	// platform's default site, as before registries existed
	if p, ok := reg.Pool("rack-7"); !ok || p.Tenant != "default" || p.Site != "default" || p.Agent != registry.AgentBCD {
		t.Errorf("open pool %+v %v", p, ok)
	}
	if _, ok := reg.Pool("-bad"); ok {
		t.Error("an invalid pool id is a pool")
	}
	// a declared registry is closed
	closed, err := registry.Parse([]byte("tenants: [{id: a}]\nsites: [{id: s, owner: platform}]\npools: [{id: p, tenant: a, site: s, agent: bcd}]"))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := closed.Pool("rack-7"); ok {
		t.Error("an undeclared pool exists")
	}
}

func TestLoadMissingFile(t *testing.T) {
	if _, err := registry.Load(filepath.Join(t.TempDir(), "none.yaml")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("error %v", err)
	}
}
