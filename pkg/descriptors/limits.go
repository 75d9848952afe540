package descriptors

import (
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"gopkg.in/yaml.v3"
)

// readTiers reads the tiers: a mapping of name to a list of rate limits.
func (p *parser) readTiers(f field) {
	p.tiers = map[string][]*RateLimit{}
	if f.val == nil {
		return
	}
	if f.val.Kind != yaml.MappingNode {
		p.errorf(f.key.Line, "tiers must be a mapping of name to rate limits, got %s", describe(f.val))
		return
	}
	seen := map[string]int{}
	for i := 0; i+1 < len(f.val.Content); i += 2 {
		k := resolve(f.val.Content[i])
		if k.Kind != yaml.ScalarNode {
			p.errorf(k.Line, "tier names must be strings, got %s", describe(k))
			continue
		}
		name := k.Value
		if line, ok := seen[name]; ok {
			p.errorf(k.Line, "duplicate tier %q (first at line %d)", name, line)
			continue
		}
		seen[name] = k.Line
		if name == "" {
			p.errorf(k.Line, "tier name must not be empty")
			continue
		}
		v := resolve(f.val.Content[i+1])
		if isNull(v) {
			v = nil
		}
		// The tier is known even when invalid, so that its users do not
		// also report an unknown tier.
		p.tiers[name] = p.limitList(field{key: k, val: v}, fmt.Sprintf("tier %q", name))
	}
}

// limitList reads a non-empty list of rate limits (rate_limits or a tier).
func (p *parser) limitList(f field, what string) []*RateLimit {
	if f.val == nil || (f.val.Kind == yaml.SequenceNode && len(f.val.Content) == 0) {
		p.errorf(f.key.Line, "%s must not be empty", what)
		return nil
	}
	if f.val.Kind != yaml.SequenceNode {
		p.errorf(f.key.Line, "%s must be a list of rate limits, got %s", what, describe(f.val))
		return nil
	}
	var out []*RateLimit
	for _, item := range f.val.Content {
		item = resolve(item)
		l := p.rateLimit(item, false)
		if l == nil {
			continue
		}
		if l.Unlimited && len(f.val.Content) > 1 {
			p.errorf(item.Line, "an unlimited rate limit must be the only one in %s", what)
			continue
		}
		out = append(out, l)
	}
	return out
}

// rateLimit reads one rate limit: a descriptor's rate_limit (single), or
// one of a list (rate_limits or a tier, envoy-rls's extensions). It returns
// nil when the limit is invalid.
func (p *parser) rateLimit(n *yaml.Node, single bool) *RateLimit {
	if n.Kind != yaml.MappingNode {
		p.errorf(n.Line, "rate limit must be a mapping, got %s", describe(n))
		return nil
	}
	start := len(p.errs)
	fs := p.fields(n, "rate limit", limitFields)
	if f := fs["shadow_mode"]; p.lenient && single && f.key != nil {
		// The reference knows shadow_mode only on descriptors and
		// ignores it in a rate_limit, where envoy-rls reads its extension.
		p.warnf(f.key.Line, "shadow_mode in a rate_limit: ignored, as the reference does (the limit is enforced; put shadow_mode on the descriptor to shadow it)")
		delete(fs, "shadow_mode")
	}
	l := &RateLimit{Line: n.Line}
	l.Name, _ = p.str(fs["name"], "name")
	l.Shadow = p.boolean(fs["shadow_mode"], "shadow_mode")
	l.Replaces = p.replaces(fs["replaces"], l.Name)
	l.Unlimited = p.boolean(fs["unlimited"], "unlimited")
	if l.Unlimited {
		for _, name := range []string{"unit", "requests_per_unit", "algorithm", "burst", "window", "consistency"} {
			if f := fs[name]; f.val != nil && !p.ignoredBesideUnlimited(f, name) {
				p.errorf(f.key.Line, "unlimited must not be combined with %s", name)
			}
		}
		l.ID = "unlimited"
		return p.valid(l, start)
	}

	alg, algOK := p.alg, true
	if f := fs["algorithm"]; f.val != nil {
		alg, algOK = p.algorithm(f, "algorithm")
	}
	l.Limit.Algorithm = alg

	l.Consistency = p.cons
	if f := fs["consistency"]; f.val != nil {
		if c := p.consistency(f, "consistency"); c != ConsistencyUnset {
			if c.Relaxed() && algOK && !SupportsConsistency(alg) {
				p.errorf(f.key.Line, "consistency %s cannot decide %s, which keeps the time of every hit: use strict (the default) or another algorithm", c, alg)
			}
			l.Consistency = c
		}
	}
	if !SupportsConsistency(alg) {
		l.Consistency = ConsistencyStrict // whatever the defaults say
	}

	switch unit, window := fs["unit"], fs["window"]; {
	case unit.val != nil && window.val != nil:
		p.errorf(window.key.Line, "unit and window are mutually exclusive")
	case unit.val != nil:
		if s, ok := p.str(unit, "unit"); ok {
			name, w, ok := lookupUnit(s)
			if !ok {
				p.errorf(unit.key.Line, "invalid unit %q (want second, minute, hour, day, week, month or year)", s)
			}
			l.Unit, l.Limit.Window = name, w
		}
	case window.val != nil:
		if s, ok := p.str(window, "window"); ok {
			w, err := time.ParseDuration(s)
			switch {
			case err != nil:
				p.errorf(window.key.Line, "window %q is not a duration like 90s or 1h30m", s)
			case w < time.Millisecond:
				p.errorf(window.key.Line, "window %s is shorter than 1ms", s)
			}
			l.Limit.Window = w
		}
	default:
		p.errorf(n.Line, "rate limit needs a unit or a window")
	}

	// A requests_per_unit of 0 is accepted, as the reference server does:
	// such a limit denies every request (a block list entry).
	if f := fs["requests_per_unit"]; f.val == nil {
		if !p.lenient {
			p.errorf(n.Line, "rate limit needs requests_per_unit")
		} else {
			p.warnf(n.Line, "rate limit without requests_per_unit: read as 0, which denies every request, as the reference does")
		}
	} else if v, ok := p.integer(f, "requests_per_unit", 0, math.MaxUint32); ok {
		l.RequestsPerUnit = uint32(v)
		l.Limit.Requests = uint64(v)
		if alg == algorithms.SlidingWindowLog && v > MaxSlidingLogRequests {
			p.errorf(f.key.Line, "requests_per_unit must be at most %d for sliding_window_log, which keeps one entry per request, got %d", MaxSlidingLogRequests, v)
		}
	}

	if f := fs["burst"]; f.val != nil {
		if v, ok := p.integer(f, "burst", 1, math.MaxUint32); ok {
			if algOK && !alg.HasBurst() {
				p.errorf(f.key.Line, "burst has no meaning for %s (only for token_bucket and gcra)", alg)
			} else if l.RequestsPerUnit == 0 && fs["requests_per_unit"].val != nil {
				p.errorf(f.key.Line, "burst has no meaning with requests_per_unit 0, which denies every request")
			}
			l.Limit.Burst = uint64(v)
		}
	}
	l.ID = CounterID(l.Limit, 0) // numbered among its siblings by nodeLimits
	return p.valid(l, start)
}

// valid returns l when no error was reported since start, else nil.
func (p *parser) valid(l *RateLimit, start int) *RateLimit {
	if len(p.errs) > start {
		return nil
	}
	// The fields were checked one by one above; Validate is the algorithms
	// package's own word on whether the limit can be decided, so a limit the
	// parser lets through can never reach a store that cannot decide it.
	if !l.Unlimited {
		if err := l.Limit.Validate(); err != nil {
			p.errorf(l.Line, "rate limit cannot be decided: %v", err)
			return nil
		}
	}
	return l
}

// CounterID is the identity of the counter of a limit: its algorithm and
// window, and n, its position among the limits of its descriptor with the
// same algorithm and window (0 for the first). It leaves out the limit's
// count (requests_per_unit, burst) on purpose: usage belongs to the
// descriptor, so a reload or a request override that changes the count
// applies it to what was already used. The state of every algorithm is kept
// in units that do not depend on the count (hits, or token·µs of debt), so
// it carries over unconverted. Only a change of algorithm or window (whose
// state means something else) starts a fresh counter. The parts contain no
// ':' or '#', so different (algorithm, window, n) never share an ID.
func CounterID(l algorithms.Limit, n int) string {
	id := l.Algorithm.String() + ":" + l.Window.String()
	if n > 0 {
		id += "#" + strconv.Itoa(n)
	}
	return id
}

// replaces reads a replaces list: [{name: X}, ...].
func (p *parser) replaces(f field, own string) []string {
	if f.val == nil {
		return nil
	}
	if f.val.Kind != yaml.SequenceNode {
		p.errorf(f.key.Line, "replaces must be a list, got %s", describe(f.val))
		return nil
	}
	var out []string
	for _, item := range f.val.Content {
		item = resolve(item)
		if item.Kind != yaml.MappingNode {
			p.errorf(item.Line, "replaces entry must be a mapping with a name, got %s", describe(item))
			continue
		}
		fs := p.fields(item, "replaces entry", []string{"name"})
		name, ok := p.str(fs["name"], "name")
		switch {
		case !ok && fs["name"].val != nil: // already reported
		case name == "":
			p.errorf(item.Line, "replaces entry has an empty name")
		case name == own:
			p.errorf(item.Line, "rate limit %q replaces its own name", own)
		default:
			out = append(out, name)
		}
	}
	return out
}
