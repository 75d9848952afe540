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
func (s *Service) batch(sc *scratch, req *rlsv3.RateLimitRequest) {
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
		if h := d.GetHitsAddend(); h != nil {
			hits = h.Value
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
		for _, l := range p.limits {
			m := mode
			if l.Shadow || (p.node != nil && p.node.ShadowMode) {
				m = backend.Shadow
			}
			// Hits charged to a quota_mode descriptor are usage accounting:
			// Envoy's quota pattern checks with 0 hits on the request path
			// and reports the real cost when the stream is done, which
			// nothing can refuse any more, so it is charged even when it
			// does not fit.
			acct := hits > 0 && quota
			sc.items = append(sc.items, backend.Item{Key: sc.kb.key(l.ID), Limit: l.Limit, Hits: hits, Mode: m, Group: group, Partition: sc.kb.partition, Account: acct})
			sc.owners = append(sc.owners, owner{desc: i, limit: l})
		}
	}
}
