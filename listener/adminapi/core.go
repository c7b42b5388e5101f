package adminapi

import (
	"fmt"
	"regexp"

	"github.com/stratumjoin/stratum/internal/cluster"
	"github.com/stratumjoin/stratum/listener/registry"
)

// The rules every facade shares: which pools a caller sees, which pools
// take a join secret, and what an `expect` binding may hold.

// poolOf returns pool poolID if tenant owns it. Another tenant's pool is
// answered exactly like a pool that does not exist.
func (s *Server) poolOf(tenant, poolID string) (registry.Pool, error) {
	pool, ok := s.core.Registry().Pool(poolID)
	if !ok || pool.Tenant != tenant {
		return registry.Pool{}, errNotFound("pool " + poolID)
	}
	return pool, nil
}

// mintablePool checks that a pool's machines run the agent that joins
// with a secret (the joinTokens API: agent bcd).
func mintablePool(pool registry.Pool) error {
	if pool.Agent != registry.AgentBCD {
		return &apiError{kind: kindInvalidState, msg: fmt.Sprintf("pool %s runs agent %q, not %s: its machines cannot join with a secret", pool.ID, pool.Agent, registry.AgentBCD)}
	}
	return nil
}

var (
	tenantRE = registry.TenantIDRE
	poolRE   = registry.PoolIDRE
)

// checkString applies a seed's "at most max characters; matches re"
// constraint; required says whether an empty value is missing.
func checkString(path, v string, required bool, max int, re *regexp.Regexp) []fieldError {
	switch {
	case v == "" && required:
		return []fieldError{{path: path, msg: "is required", code: keyErrMissingValue}}
	case v == "":
		return nil
	case len(v) > max:
		return []fieldError{{path: path, msg: fmt.Sprintf("must be at most %d characters", max)}}
	case !re.MatchString(v):
		return []fieldError{{path: path, msg: "must match " + re.String()}}
	}
	return nil
}

// validateExpect checks an `expect` binding as the joinTokens API constrains it
// (the core's rule: patterns, no firmware placeholders, at least one
// identifier) and names each problem at its field path under prefix.
func validateExpect(e *cluster.Expect, prefix string) []fieldError {
	var errs []fieldError
	for _, p := range e.Validate() {
		path := prefix
		if p.Field != "" {
			path += "." + p.Field
		}
		errs = append(errs, fieldError{path: path, msg: p.Message})
	}
	return errs
}

func expectEqual(a, b *cluster.Expect) bool {
	if a.Empty() || b.Empty() {
		return a.Empty() == b.Empty()
	}
	return *a == *b
}
