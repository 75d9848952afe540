package rls

import (
	"strconv"
	"strings"
	"sync"

	"github.com/envoyrls/envoy-rls/pkg/descriptors"
)

// ruleNames caches each configured limit's rule name (its name, else its
// descriptor path, with "#i" for the i-th limit of an unnamed composite).
// It belongs to one config: SetConfig starts a new one, so it holds at most
// the config's limits.
type ruleNames struct {
	m sync.Map // *descriptors.RateLimit -> string
}

// ruleName returns the rule name of limit l of plan p in domain.
func (s *Service) ruleName(domain string, p *plan, l *descriptors.RateLimit) string {
	if p.override != nil {
		return "override"
	}
	if l.Name != "" {
		return l.Name
	}
	names := s.rules.Load()
	if v, ok := names.m.Load(l); ok {
		return v.(string)
	}
	// StatsKey with no entries is the node's static path, with its
	// configured values only.
	name := strings.TrimPrefix(p.node.StatsKey(nil), domain+".")
	if len(p.node.Limits) > 1 {
		for i, x := range p.node.Limits {
			if x == l {
				name += "#" + strconv.Itoa(i)
			}
		}
	}
	names.m.Store(l, name)
	return name
}
