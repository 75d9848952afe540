package rls

import (
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/envoyrls/envoy-rls/pkg/backend"
	"github.com/envoyrls/envoy-rls/pkg/descriptors"
)

// owner ties an item back to its descriptor and limit.
type owner struct {
	desc  int
	limit *descriptors.RateLimit
}

// batch turns the plans into store items with unambiguous keys.
func (s *Service) batch(sc *scratch, dom *descriptors.Domain, req *rlsv3.RateLimitRequest) {
	sc.items = sc.items[:0]
	sc.owners = sc.owners[:0]
	for i := range sc.plans {
		p := &sc.plans[i]
		if p.unlimited || len(p.limits) == 0 {
			continue
		}
		d := req.Descriptors[i]
		hits := uint64(1)
		if req.HitsAddend > 0 {
			hits = uint64(req.HitsAddend)
		}
		explicit := false
		if h := d.GetHitsAddend(); h != nil {
			hits, explicit = h.Value, true
		}
		if d.IsNegativeHits {
			// Refunds are not supported: a negative-hits descriptor is
			// checked without charging.
			hits = 0
		}
		sc.kb.reset(req.Domain)
		path := sc.paths[p.pathOff : p.pathOff+p.pathLen]
		for j, e := range d.Entries {
			v := e.Value
			if j < len(path) {
				// All values matching a share_threshold wildcard share one
				// counter.
				v = path[j].CounterValue(v)
			}
			sc.kb.entry(e.Key, v)
		}
		sc.kb.seal()
		mode, group := backend.Enforced, 0
		quota := p.node != nil && (p.node.QuotaMode || s.opts.QuotaMode)
		if quota {
			mode, group = backend.Quota, i
		}
		// Usage accounting: hits that already happened, which nothing can
		// refuse any more, are charged even when they do not fit. Envoy's
		// quota pattern checks with 0 hits on the request path and reports
		// the real cost when the stream is done (Envoy Gateway's
		// cost.response, Envoy AI Gateway's token costs), both as the
		// descriptor's own hits_addend, which Envoy sends exactly when the
		// rate limit action sets one; nothing else on the wire tells a
		// report from an admission. So by default (auto) hits given on the
		// descriptor are accounted, and ordinary admission keeps "a denied
		// request charges nothing" (see descriptors.UsageAccounting).
		// quota_mode accounts every charge.
		acct := hits > 0 && quota
		if !acct {
			acct = s.usageAccounting(dom, p).Accounts(hits, explicit)
		}
		for _, l := range p.limits {
			m := mode
			if l.Shadow || (p.node != nil && p.node.ShadowMode) {
				m = backend.Shadow
			}
			sc.items = append(sc.items, backend.Item{Key: sc.kb.key(l.ID), Limit: l.Limit, Hits: hits, Mode: m, Group: group, Partition: sc.kb.partition, Account: acct,
				Consistency: s.consistency(p, l)})
			sc.owners = append(sc.owners, owner{desc: i, limit: l})
		}
	}
}

// usageAccounting returns the usage accounting of a planned descriptor:
// its node's (its own, an ancestor's or its file's default), else, for a
// request limit override, its domain's file default, else the service's.
func (s *Service) usageAccounting(dom *descriptors.Domain, p *plan) descriptors.UsageAccounting {
	switch {
	case p.node != nil:
		return p.node.UsageAccounting.Or(s.opts.UsageAccounting)
	case dom != nil:
		return dom.DefaultUsageAccounting.Or(s.opts.UsageAccounting)
	}
	return s.opts.UsageAccounting
}

// consistency returns the backend consistency of a planned limit: its own
// or its file's (see descriptors.RateLimit.Consistency), else the
// service's default. A request's limit override is always strict: it
// shares its counter with the configured limit of the same algorithm and
// window (and with other overrides), whatever count each asks for, so no
// chunk reserved under one count could serve it.
func (s *Service) consistency(p *plan, l *descriptors.RateLimit) backend.Consistency {
	if p.override != nil {
		return backend.Strict
	}
	switch l.Consistency.Or(s.opts.Consistency) {
	case descriptors.ConsistencyLease:
		return backend.Lease
	case descriptors.ConsistencyApproximate:
		return backend.Approximate
	}
	return backend.Strict
}
