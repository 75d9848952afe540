package descriptors

import (
	"math"
	"strings"

	"google.golang.org/protobuf/types/known/structpb"
	"gopkg.in/yaml.v3"
)

// descriptors reads a list of descriptors below parent (nil at the top).
func (p *parser) descriptors(f field, parent *Node) level {
	if f.val == nil {
		return nil
	}
	if f.val.Kind != yaml.SequenceNode {
		p.errorf(f.key.Line, "descriptors must be a list, got %s", describe(f.val))
		return nil
	}
	lvl := level{}
	seen := map[Entry]int{} // key and value ("" for none) -> line
	for _, item := range f.val.Content {
		item = resolve(item)
		if item.Kind != yaml.MappingNode {
			p.errorf(item.Line, "descriptor must be a mapping, got %s", describe(item))
			continue
		}
		n := p.node(item, parent)
		if n == nil {
			continue
		}
		k := Entry{n.Key, n.Value}
		if line, ok := seen[k]; ok {
			if n.Value == "" {
				p.errorf(n.Line, "duplicate descriptor with key %q and no value (first at line %d)", n.Key, line)
			} else {
				p.errorf(n.Line, "duplicate descriptor with key %q and value %q (first at line %d)", n.Key, n.Value, line)
			}
			continue
		}
		seen[k] = n.Line
		lvl.add(n)
	}
	return lvl
}

func (l level) add(n *Node) {
	g := l[n.Key]
	if g == nil {
		g = &keyGroup{}
		l[n.Key] = g
	}
	switch {
	case n.Value == "":
		g.def = n
	case n.Wildcard:
		g.wild = append(g.wild, n)
	default:
		if g.exact == nil {
			g.exact = map[string]*Node{}
		}
		g.exact[n.Value] = n
	}
}

// node reads one descriptor and its children. It returns nil when the
// descriptor has no usable key or value (its contents are still checked).
func (p *parser) node(m *yaml.Node, parent *Node) *Node {
	fs := p.fields(m, "descriptor", nodeFields)
	n := &Node{Line: m.Line, parent: parent, depth: 1, domain: p.domain}
	if parent != nil {
		n.depth = parent.depth + 1
	}
	keyOK := false
	switch f := fs["key"]; {
	case f.key == nil:
		p.errorf(m.Line, "descriptor has no key")
	case isEmpty(f.val):
		p.errorf(f.key.Line, "descriptor key must not be empty")
	default:
		n.Key, keyOK = p.str(f, "key")
	}
	// An empty value is no value, as for the reference server.
	value, valueOK := p.str(fs["value"], "value")
	n.Value, valueOK = value, valueOK || fs["value"].val == nil // unset is fine
	n.Wildcard = strings.Contains(n.Value, "*")
	if n.Wildcard {
		n.pattern = compilePattern(n.Value)
	}
	n.ShadowMode = p.boolean(fs["shadow_mode"], "shadow_mode")
	n.QuotaMode = p.boolean(fs["quota_mode"], "quota_mode")
	n.UsageAccounting = p.usageAccounting(fs["usage_accounting"], "usage_accounting")
	if n.QuotaMode && n.UsageAccounting != UsageUnset && n.UsageAccounting != UsageAlways {
		p.errorf(fs["usage_accounting"].key.Line, "usage_accounting: %s contradicts quota_mode, which accounts every charge (leave it out, or say always)", n.UsageAccounting)
	}
	switch {
	case n.UsageAccounting != UsageUnset:
	case parent != nil:
		n.UsageAccounting = parent.UsageAccounting
	default:
		n.UsageAccounting = p.usage
	}
	n.DetailedMetric = p.boolean(fs["detailed_metric"], "detailed_metric")
	n.ValueToMetric = p.boolean(fs["value_to_metric"], "value_to_metric")
	n.ShareThreshold = p.boolean(fs["share_threshold"], "share_threshold")
	if n.ShareThreshold && !n.Wildcard {
		p.errorf(fs["share_threshold"].key.Line, "share_threshold requires a wildcard value (with '*')")
	}
	n.Metadata = p.metadata(fs["metadata"])
	n.Limits = p.nodeLimits(fs, n.ShadowMode)
	n.setStats()
	n.children = p.descriptors(fs["descriptors"], n)
	if !keyOK || !valueOK {
		return nil
	}
	return n
}

// nodeLimits reads the limits of a descriptor: rate_limit, rate_limits or
// tier, at most one of them. Each node gets its own copies, so that Shadow
// can include the node's shadow_mode.
func (p *parser) nodeLimits(fs map[string]field, shadow bool) []*RateLimit {
	var limits []*RateLimit
	set := 0
	for _, name := range []string{"rate_limit", "rate_limits", "tier"} {
		f := fs[name]
		if f.val == nil {
			continue
		}
		if set++; set > 1 {
			p.errorf(f.key.Line, "only one of rate_limit, rate_limits and tier may be set")
		}
		var ls []*RateLimit
		switch name {
		case "rate_limit":
			if l := p.rateLimit(f.val, true); l != nil {
				ls = []*RateLimit{l}
			}
		case "rate_limits":
			ls = p.limitList(f, "rate_limits")
		case "tier":
			if t, ok := p.str(f, "tier"); ok {
				var known bool
				if ls, known = p.tiers[t]; !known {
					p.errorf(f.key.Line, "unknown tier %q", t)
				}
			}
		}
		if set == 1 {
			for _, l := range ls {
				c := *l
				c.Shadow = c.Shadow || shadow
				if !c.Unlimited {
					// Limits of one descriptor with the same algorithm and
					// window count apart.
					n := 0
					for _, o := range limits {
						if !o.Unlimited && o.Limit.Algorithm == c.Limit.Algorithm && o.Limit.Window == c.Limit.Window {
							n++
						}
					}
					c.ID = CounterID(c.Limit, n)
				}
				limits = append(limits, &c)
			}
		}
	}
	return limits
}

// metadata reads the metadata mapping of a descriptor.
func (p *parser) metadata(f field) *structpb.Struct {
	if f.val == nil {
		return nil
	}
	if f.val.Kind != yaml.MappingNode {
		p.errorf(f.key.Line, "metadata must be a mapping, got %s", describe(f.val))
		return nil
	}
	return p.value(f.val, 1).GetStructValue()
}

// MaxMetadataDepth bounds the nesting of a descriptor's metadata (a mapping
// or list inside another counts one level). The metadata goes into every
// response that passes the descriptor, and decoders refuse messages nested
// too deeply (protobuf's default recursion limit is 100 messages, and each
// level here is two).
const MaxMetadataDepth = 32

// value converts YAML to a protobuf Value: mappings to structs, lists to
// lists, and scalars by their YAML type. depth is the nesting level of n.
func (p *parser) value(n *yaml.Node, depth int) *structpb.Value {
	n = resolve(n)
	if depth > MaxMetadataDepth && (n.Kind == yaml.MappingNode || n.Kind == yaml.SequenceNode) {
		p.errorf(n.Line, "metadata is nested more than %d levels deep", MaxMetadataDepth)
		return structpb.NewNullValue()
	}
	switch n.Kind {
	case yaml.MappingNode:
		s := &structpb.Struct{Fields: make(map[string]*structpb.Value, len(n.Content)/2)}
		seen := map[string]pair{}
		for _, q := range p.pairs(n) {
			k := q.k
			if k.Kind != yaml.ScalarNode {
				p.errorf(k.Line, "metadata keys must be strings, got %s", describe(k))
				continue
			}
			if prev, ok := seen[k.Value]; ok {
				switch {
				case q.from != 0 || prev.from != 0: // a << is involved
					if !p.mergeOverride(k.Value, prev.k.Line, prev.from, q) {
						continue
					}
				case !p.lenient:
					p.errorf(k.Line, "duplicate field %q (first at line %d)", k.Value, prev.k.Line)
					continue
				default:
					p.warnf(k.Line, "metadata field %s given twice (%s): using the last, as the reference does", k.Value, lines(prev.k.Line, k.Line))
				}
			}
			seen[k.Value] = q
			s.Fields[k.Value] = p.value(q.v, depth+1)
		}
		return structpb.NewStructValue(s)
	case yaml.SequenceNode:
		l := &structpb.ListValue{Values: make([]*structpb.Value, 0, len(n.Content))}
		for _, c := range n.Content {
			l.Values = append(l.Values, p.value(c, depth+1))
		}
		return structpb.NewListValue(l)
	}
	switch n.ShortTag() {
	case "!!null":
		return structpb.NewNullValue()
	case "!!bool":
		var b bool
		if n.Decode(&b) == nil {
			return structpb.NewBoolValue(b)
		}
	case "!!int", "!!float":
		var f float64
		if n.Decode(&f) == nil {
			if math.IsInf(f, 0) || math.IsNaN(f) {
				p.errorf(n.Line, "metadata number %s is not finite", n.Value)
			}
			return structpb.NewNumberValue(f)
		}
	}
	return structpb.NewStringValue(n.Value)
}
