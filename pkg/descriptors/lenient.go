package descriptors

import (
	"fmt"
	"strings"

	"gopkg.in/yaml.v3"
)

// This file holds what Options.Lenient accepts: the files the reference
// server's config checker accepts and envoy-rls refuses by default, each
// with the reference's meaning and a warning.

// refFields are the field names the reference server knows. Its check is
// one list for every level of the format, so it accepts any of them
// anywhere, and ignores those that mean nothing where they are.
var refFields = []string{"domain", "key", "value", "descriptors", "rate_limit", "unit", "requests_per_unit",
	"unlimited", "shadow_mode", "quota_mode", "name", "replaces", "detailed_metric", "value_to_metric",
	"share_threshold", "metadata"}

// warnf records a warning: something lenient accepted that the default
// refuses.
func (p *parser) warnf(line int, format string, args ...any) {
	p.warns = append(p.warns, &Error{File: p.file, Line: line, Reason: fmt.Sprintf(format, args...)})
}

// ignoredField is lenient's answer for a field that is not one of the
// fields of its mapping (what): the reference ignores it when it is one of
// its own names and its value passes the reference's key check. It
// reports whether the field was ignored; otherwise it is an error.
func (p *parser) ignoredField(k, v *yaml.Node, what string) bool {
	if !p.lenient || !contains(refFields, k.Value) {
		return false
	}
	start := len(p.errs)
	if k.Value != "metadata" { // the reference checks nothing in metadata
		p.refCheck(v)
	}
	if len(p.errs) > start {
		return true // refused by the reference too: the errors say why
	}
	p.warnf(k.Line, "%s is not a field of %s: ignored, as the reference does", k.Value, article(what))
	return true
}

// refCheck reports what the reference server's key check refuses in a
// value it otherwise ignores: mappings must have known string keys (any
// level's), lists must hold mappings, and other values must be strings,
// integers, booleans or null.
func (p *parser) refCheck(n *yaml.Node) {
	n = resolve(n)
	switch n.Kind {
	case yaml.MappingNode:
		for _, q := range p.pairs(n) {
			switch k := q.k; {
			case k.Kind != yaml.ScalarNode || k.ShortTag() != "!!str":
				p.errorf(k.Line, "field names must be strings, got %s", describe(k))
			case !contains(refFields, k.Value):
				p.errorf(k.Line, "unknown field %q (in a value the reference ignores, which it still checks)", k.Value)
			case k.Value != "metadata":
				p.refCheck(q.v)
			}
		}
	case yaml.SequenceNode:
		for _, c := range n.Content {
			if resolve(c).Kind != yaml.MappingNode {
				p.errorf(resolve(c).Line, "a list may hold only mappings, got %s (in a value the reference ignores, which it still checks)", describe(resolve(c)))
				continue
			}
			p.refCheck(c)
		}
	case yaml.ScalarNode:
		switch n.ShortTag() {
		case "!!str", "!!bool", "!!null":
		case "!!int":
			var v int64
			if n.Decode(&v) != nil {
				p.errorf(n.Line, "%s is not a 64-bit integer (in a value the reference ignores, which it still checks)", n.Value)
			}
		default:
			p.errorf(n.Line, "%s must be a string, an integer, a boolean or null (in a value the reference ignores, which it still checks)", describe(n))
		}
	}
}

// article puts "a" or "an" before what.
func article(what string) string {
	if what != "" && strings.ContainsRune("aeiou", rune(what[0])) {
		return "an " + what
	}
	return "a " + what
}

// lines says "lines 3 and 7".
func lines(a, b int) string { return fmt.Sprintf("lines %d and %d", a, b) }

// skipped turns the errors of a document after the first of its file into
// warnings: the reference reads only a file's first document, so lenient
// skips a later one that does not load (what: "it", or "the rest of the
// file" after a YAML error) and keeps the others.
func skipped(doc int, errs Errors, what string) Errors {
	out := make(Errors, 0, len(errs))
	for _, e := range errs {
		out = append(out, &Error{File: e.File, Line: e.Line,
			Reason: fmt.Sprintf("%s; document %d of the file does not load, so %s is skipped (the reference reads only the first document of a file)", e.Reason, doc, what)})
	}
	return out
}

// ignoredBesideUnlimited is lenient's answer for a field set beside
// unlimited: true. The reference ignores requests_per_unit there, and a
// unit that is not one of its units; it reports whether f was ignored.
func (p *parser) ignoredBesideUnlimited(f field, name string) bool {
	if !p.lenient {
		return false
	}
	switch name {
	case "requests_per_unit":
		var v uint32 // the reference still reads it
		if f.val.Kind != yaml.ScalarNode || f.val.ShortTag() != "!!int" || f.val.Decode(&v) != nil {
			return false
		}
		p.warnf(f.key.Line, "requests_per_unit %s beside unlimited: true: ignored, as the reference does (the limit is unlimited)", f.val.Value)
		return true
	case "unit":
		if f.val.Kind != yaml.ScalarNode {
			return false
		}
		if _, _, ok := lookupUnit(f.val.Value); ok {
			return false // the reference refuses a valid unit with unlimited
		}
		p.warnf(f.key.Line, "unit %q beside unlimited: true is not a unit: ignored, as the reference does", f.val.Value)
		return true
	}
	return false
}

// repeated returns the value the reference reads for a field given twice
// in one mapping, with a warning: the last one, except for rate_limit and
// metadata given as two mappings, which are merged (see deepMerge).
func (p *parser) repeated(name string, prev field, k, v *yaml.Node) *yaml.Node {
	if deepMerged(name, prev.val, v) {
		p.warnf(k.Line, "%s given twice (%s): the two are merged, the last value of each field winning, as the reference does", name, lines(prev.key.Line, k.Line))
		return mergeNode(k.Line, prev.val, v)
	}
	p.warnf(k.Line, "%s given twice (%s): using the last, as the reference does", name, lines(prev.key.Line, k.Line))
	return v
}

// overridden returns the value of a field that overrides the one a <<
// gave (or that a << overrides), or nil after an error. YAML replaces the
// earlier value; the reference (yaml.v2) does too, except for rate_limit
// and metadata mappings, which it merges (see deepMerge). Where the two
// differ (the earlier mapping has a field the later one lacks) it is an
// error by default and the reference's merge, with a warning, when
// lenient.
func (p *parser) overridden(name string, prev field, k, v *yaml.Node) *yaml.Node {
	if !deepMerged(name, prev.val, v) {
		return v
	}
	have := map[string]bool{}
	for _, q := range p.pairs(v) {
		have[q.k.Value] = true
	}
	for _, q := range p.pairs(prev.val) {
		if have[q.k.Value] {
			continue
		}
		if !p.lenient {
			p.errorf(k.Line, "%s overrides the one of line %d, which has %s: YAML drops it, the reference server merges the two mappings (give every field in one)", name, prev.key.Line, q.k.Value)
			return nil
		}
		p.warnf(k.Line, "%s overrides the one of line %d, which has %s: the two are merged, the last value of each field winning, as the reference does", name, prev.key.Line, q.k.Value)
		return mergeNode(k.Line, prev.val, v)
	}
	return v
}

// deepMerged reports the fields that the reference (yaml.v2) merges when
// they are given twice as mappings: it decodes the second into what the
// first filled (a pointer to a struct, a map), so each field of the first
// stays unless the second gives it.
func deepMerged(name string, prev, cur *yaml.Node) bool {
	return (name == "rate_limit" || name == "metadata") && prev != nil &&
		prev.Kind == yaml.MappingNode && cur.Kind == yaml.MappingNode
}

// mergeNode is the mapping {<<: a, <<: b}: the fields of a, then those of
// b, the last of each winning.
func mergeNode(line int, a, b *yaml.Node) *yaml.Node {
	key := func() *yaml.Node {
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!merge", Value: "<<", Line: line}
	}
	return &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Line: a.Line, Column: a.Column,
		Content: []*yaml.Node{key(), a, key(), b}}
}
