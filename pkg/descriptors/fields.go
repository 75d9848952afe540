package descriptors

import (
	"strconv"

	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"gopkg.in/yaml.v3"
)

// field is one key of a mapping and its value. val is nil when the key is
// absent or its value is null: null means "not set" throughout the format,
// as it does for the reference server.
type field struct {
	key, val *yaml.Node
	from     int // the line of the << that gave it, 0 when written in the mapping
}

// resolve follows an alias to the node it names.
func resolve(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

// isNull reports a YAML null (~, null or nothing).
func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

// isEmpty reports a field value that is unset (nil) or the empty string.
func isEmpty(n *yaml.Node) bool {
	return n == nil || (n.Kind == yaml.ScalarNode && n.Value == "")
}

// describe names a value for error messages.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	}
	return strconv.Quote(n.Value)
}

// fields reads the mapping n of the given kind (what), reporting fields not
// in allowed and fields given twice.
func (p *parser) fields(n *yaml.Node, what string, allowed []string) map[string]field {
	fs := make(map[string]field, len(n.Content)/2)
	for _, q := range p.pairs(n) {
		k, v := q.k, q.v
		if k.Kind != yaml.ScalarNode {
			p.errorf(k.Line, "field names must be strings, got %s", describe(k))
			continue
		}
		name := k.Value
		if !contains(allowed, name) {
			if !p.ignoredField(k, v, what) {
				p.errorf(k.Line, "unknown field %q in %s", name, what)
			}
			continue
		}
		if prev, ok := fs[name]; ok {
			switch {
			case q.from != 0 || prev.from != 0: // a << is involved
				if !p.mergeOverride(name, prev.key.Line, prev.from, q) {
					continue
				}
				if v = p.overridden(name, prev, k, v); v == nil {
					continue
				}
			case !p.lenient:
				p.errorf(k.Line, "duplicate field %q (first at line %d)", name, prev.key.Line)
				continue
			default:
				v = p.repeated(name, prev, k, v)
			}
		}
		if isNull(v) {
			v = nil
		}
		fs[name] = field{key: k, val: v, from: q.from}
	}
	return fs
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// str returns a scalar's text as written (so `value: yes` is "yes"). It
// reports false when the field is not set or is not a scalar.
func (p *parser) str(f field, name string) (string, bool) {
	if f.val == nil {
		return "", false
	}
	if f.val.Kind != yaml.ScalarNode {
		p.errorf(f.key.Line, "%s must be a string, got %s", name, describe(f.val))
		return "", false
	}
	return f.val.Value, true
}

// boolean returns a flag; unset is false. YAML 1.1 spellings such as yes and
// on are accepted, as the reference server (yaml.v2) does.
func (p *parser) boolean(f field, name string) bool {
	if f.val == nil {
		return false
	}
	var b bool
	if f.val.Kind != yaml.ScalarNode || f.val.Decode(&b) != nil {
		p.errorf(f.key.Line, "%s must be true or false, got %s", name, describe(f.val))
		return false
	}
	return b
}

// integer returns a set integer field within [lo, hi].
func (p *parser) integer(f field, name string, lo, hi int64) (int64, bool) {
	var v int64
	if f.val.Kind != yaml.ScalarNode || f.val.ShortTag() != "!!int" || f.val.Decode(&v) != nil || v < lo || v > hi {
		p.errorf(f.key.Line, "%s must be an integer from %d to %d, got %s", name, lo, hi, describe(f.val))
		return 0, false
	}
	return v, true
}

// algorithm returns a set algorithm field.
func (p *parser) algorithm(f field, name string) (algorithms.Kind, bool) {
	s, ok := p.str(f, name)
	if !ok {
		return p.alg, false
	}
	k, ok := algorithms.ParseKind(s)
	if !ok {
		p.errorf(f.key.Line, "unknown %s %q (want %s)", name, s, algorithmNames)
		return p.alg, false
	}
	return k, true
}
