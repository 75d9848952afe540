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
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := resolve(n.Content[i])
			switch {
			case k.Kind != yaml.ScalarNode || k.ShortTag() != "!!str":
				p.errorf(k.Line, "field names must be strings, got %s", describe(k))
			case !contains(refFields, k.Value):
				p.errorf(k.Line, "unknown field %q (in a value the reference ignores, which it still checks)", k.Value)
			case k.Value != "metadata":
				p.refCheck(n.Content[i+1])
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

// repeated is lenient's answer for a field given twice in one mapping: the
// value the reference reads. That is the last one, except for rate_limit
// and metadata given as two mappings: the reference (yaml.v2) decodes the
// second into what the first filled, so their fields are merged, the last
// value of each winning; the merged mapping is returned for the caller to
// read (with its own warnings for the fields both give).
func (p *parser) repeated(name string, prev field, k, v *yaml.Node) *yaml.Node {
	if (name == "rate_limit" || name == "metadata") && prev.val != nil &&
		prev.val.Kind == yaml.MappingNode && v.Kind == yaml.MappingNode {
		p.warnf(k.Line, "%s given twice (%s): the two are merged, the last value of each field winning, as the reference does", name, lines(prev.key.Line, k.Line))
		merged := *prev.val
		merged.Content = append(append([]*yaml.Node{}, prev.val.Content...), v.Content...)
		return &merged
	}
	p.warnf(k.Line, "%s given twice (%s): using the last, as the reference does", name, lines(prev.key.Line, k.Line))
	return v
}
