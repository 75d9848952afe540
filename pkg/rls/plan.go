package rls

import (
	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/descriptors"
)

// plan is what one request descriptor turned into.
type plan struct {
	node      *descriptors.Node
	limits    []*descriptors.RateLimit
	override  *descriptors.RateLimit
	pathOff   int // this plan's matched path is paths[pathOff:pathOff+pathLen]
	pathLen   int
	statKey   string // the descriptor's stats key, for metrics
	unlimited bool   // an unlimited limit applies (and nothing else counts)
}

// plan matches every descriptor and resolves replaces.
func (s *Service) plan(sc *scratch, dom *descriptors.Domain, req *rlsv3.RateLimitRequest) {
	sc.plans = sc.plans[:0]
	sc.paths = sc.paths[:0]
	var replaced map[string]bool
	for _, d := range req.Descriptors {
		p := plan{}
		if dom == nil {
			sc.plans = append(sc.plans, p)
			continue
		}
		if empty(d) {
			// One odd descriptor from a route action must not turn off
			// limiting for the others: it is answered as matching nothing,
			// and counted and logged (at debug) as unmatched.
			sc.plans = append(sc.plans, p)
			continue
		}
		if d.Limit != nil {
			p.override = overrideLimit(dom, d.Limit)
			p.limits = []*descriptors.RateLimit{p.override}
			if s.opts.Metrics != nil {
				p.statKey = req.Domain + ".override"
			}
			sc.plans = append(sc.plans, p)
			continue
		}
		sc.entries = sc.entries[:0]
		for _, e := range d.Entries {
			sc.entries = append(sc.entries, descriptors.Entry{Key: e.Key, Value: e.Value})
		}
		sc.path = dom.Match(sc.entries, sc.path[:0])
		if len(sc.path) == 0 {
			sc.plans = append(sc.plans, p)
			continue
		}
		p.node = sc.path[len(sc.path)-1]
		p.pathOff, p.pathLen = len(sc.paths), len(sc.path)
		sc.paths = append(sc.paths, sc.path...)
		if s.opts.Metrics != nil {
			p.statKey = p.node.StatsKey(sc.entries)
		}
		p.limits = p.node.Limits
		for _, l := range p.limits {
			if l.Unlimited {
				p.unlimited = true
			}
			for _, name := range l.Replaces {
				if replaced == nil {
					replaced = map[string]bool{}
				}
				replaced[name] = true
			}
		}
		sc.plans = append(sc.plans, p)
	}
	if replaced == nil {
		return
	}
	for i := range sc.plans {
		p := &sc.plans[i]
		if p.node == nil {
			continue
		}
		var kept []*descriptors.RateLimit
		dropped := false
		for _, l := range p.limits {
			if l.Name != "" && replaced[l.Name] {
				dropped = true
				continue
			}
			kept = append(kept, l)
		}
		if dropped {
			p.limits = kept
			p.unlimited = false
			for _, l := range kept {
				p.unlimited = p.unlimited || l.Unlimited
			}
		}
	}
}

// empty reports a descriptor that can match no limit: no entries, or an
// entry whose key is empty.
func empty(d *commonv3.RateLimitDescriptor) bool {
	if len(d.GetEntries()) == 0 {
		return true
	}
	for _, e := range d.Entries {
		if e.GetKey() == "" {
			return true
		}
	}
	return false
}

// overrideLimit builds the limit of a request-supplied override. Like the
// reference it is never in shadow mode; it uses the domain's default
// algorithm.
func overrideLimit(dom *descriptors.Domain, o *commonv3.RateLimitDescriptor_RateLimitOverride) *descriptors.RateLimit {
	w, _ := overrideWindow(o) // validated
	l := algorithms.Limit{Algorithm: dom.DefaultAlgorithm, Requests: uint64(o.RequestsPerUnit), Window: w}
	if l.Algorithm == algorithms.SlidingWindowLog && l.Requests > descriptors.MaxSlidingLogRequests {
		// The log keeps one entry per request: past the config's bound, an
		// override counts with the sliding window counter instead, so a
		// request cannot make one key's state grow without bound.
		l.Algorithm = algorithms.SlidingWindowCounter
	}
	return &descriptors.RateLimit{
		Unit:            unitName(o.Unit),
		RequestsPerUnit: o.RequestsPerUnit,
		Limit:           l,
		// The descriptor's counter, as in the reference: an override shares
		// it with the configured limit of the same algorithm and window
		// (and with other overrides of that window), so usage carries over
		// whatever count each request asks for.
		ID: descriptors.CounterID(l, 0),
	}
}

func unitName(u typev3.RateLimitUnit) string {
	return typev3.RateLimitUnit_name[int32(u)]
}
