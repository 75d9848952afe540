package descriptors

import "gopkg.in/yaml.v3"

// pair is one key and value of a mapping, after YAML merge keys (<<) are
// expanded; from is the line of the << that brought it, 0 for a key
// written in the mapping itself.
type pair struct {
	k, v *yaml.Node
	from int
}

// isMergeKey reports the YAML merge key <<.
func isMergeKey(k *yaml.Node) bool {
	return k.Kind == yaml.ScalarNode && k.ShortTag() == "!!merge"
}

// pairs returns the keys and values of the mapping n in the order the
// reference server (yaml.v2) applies them, the last of a key winning: a
// merge key (<<: *anchor, or a list of them) stands for the pairs of the
// mappings it names at its place, the first of a list winning over the
// later ones. A merge value that is not a mapping or a list of mappings
// is an error.
func (p *parser) pairs(n *yaml.Node) []pair {
	out := make([]pair, 0, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := resolve(n.Content[i]), resolve(n.Content[i+1])
		if !isMergeKey(k) {
			out = append(out, pair{k: k, v: v})
			continue
		}
		var maps []*yaml.Node
		switch v.Kind {
		case yaml.MappingNode:
			maps = []*yaml.Node{v}
		case yaml.SequenceNode:
			for j := len(v.Content) - 1; j >= 0; j-- { // the earlier win
				maps = append(maps, resolve(v.Content[j]))
			}
		}
		if len(maps) == 0 && v.Kind != yaml.SequenceNode {
			p.errorf(k.Line, "<< must name a mapping or a list of mappings, got %s", describe(v))
			continue
		}
		for _, m := range maps {
			if m.Kind != yaml.MappingNode {
				p.errorf(k.Line, "<< must name a mapping or a list of mappings, got %s", describe(m))
				continue
			}
			for _, q := range p.pairs(m) {
				if q.from == 0 {
					q.from = k.Line
				}
				out = append(out, q)
			}
		}
	}
	return out
}

// mergeOverride handles a key given twice when a merge key is involved
// (prev, then cur). A key written after the << overrides the merged one,
// as YAML and the reference agree. A merged key that overrides one written
// before the << is read as the reference (yaml.v2) reads it, the merged
// value, but YAML says the written one wins: an error by default, a
// warning when lenient. It reports whether cur replaces prev.
func (p *parser) mergeOverride(name string, prevLine, prevFrom int, cur pair) bool {
	if cur.from == 0 || prevFrom != 0 {
		return true // written after the <<, or both merged
	}
	if !p.lenient {
		p.errorf(prevLine, "%s is written before the << of line %d that also gives it: YAML takes this one, the reference server the merged one (put << first)", name, cur.from)
		return false
	}
	p.warnf(prevLine, "%s is written before the << of line %d that also gives it: using the merged value, as the reference does", name, cur.from)
	return true
}
