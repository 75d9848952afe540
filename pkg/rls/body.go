package rls

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// BodyTemplate is a JSON body for OVER_LIMIT answers (returned as raw_body)
// with placeholders filled per answer:
//
//	{{rule}}             the denying rule's name, or its descriptor path
//	{{domain}}           the request's domain
//	{{descriptor_index}} the denying descriptor's index in the request
//	{{retry_after}}      whole seconds until the request could pass
//
// {{rule}} and {{domain}} are inserted JSON-escaped without quotes, so the
// template puts them inside a string: {"rule":"{{rule}}"}. The others are
// integers.
type BodyTemplate struct {
	parts []bodyPart
	src   string
}

type bodyPart struct {
	text string
	hole string // "" for literal text
}

// BodyValues are the values that fill a BodyTemplate.
type BodyValues struct {
	Rule            string
	Domain          string
	DescriptorIndex int
	RetryAfter      int64
}

var bodyHoles = []string{"rule", "domain", "descriptor_index", "retry_after"}

// ParseBodyTemplate parses a template. It is an error when a placeholder is
// unknown or unclosed, or when the template filled with sample values
// (including quotes and backslashes in the strings) is not valid JSON.
func ParseBodyTemplate(src string) (*BodyTemplate, error) {
	t := &BodyTemplate{src: src}
	rest := src
	for rest != "" {
		i := strings.Index(rest, "{{")
		if i < 0 {
			t.parts = append(t.parts, bodyPart{text: rest})
			break
		}
		if i > 0 {
			t.parts = append(t.parts, bodyPart{text: rest[:i]})
		}
		j := strings.Index(rest[i:], "}}")
		if j < 0 {
			return nil, fmt.Errorf("over-limit body: %q is not closed with }}", rest[i:])
		}
		name := strings.TrimSpace(rest[i+2 : i+j])
		known := false
		for _, h := range bodyHoles {
			known = known || h == name
		}
		if !known {
			return nil, fmt.Errorf("over-limit body: unknown placeholder {{%s}} (want rule, domain, descriptor_index or retry_after)", name)
		}
		t.parts = append(t.parts, bodyPart{hole: name})
		rest = rest[i+j+2:]
	}
	sample := t.Render(BodyValues{Rule: `a "quoted" \ rule`, Domain: "d\u00e9", DescriptorIndex: 12, RetryAfter: 34})
	if !json.Valid(sample) {
		return nil, fmt.Errorf("over-limit body: not valid JSON once filled in (for example %s)", sample)
	}
	return t, nil
}

// String returns the template's source.
func (t *BodyTemplate) String() string { return t.src }

// Render fills the template.
func (t *BodyTemplate) Render(v BodyValues) []byte {
	buf := make([]byte, 0, len(t.src)+len(v.Rule)+len(v.Domain)+16)
	for _, p := range t.parts {
		switch p.hole {
		case "":
			buf = append(buf, p.text...)
		case "rule":
			buf = appendJSONStringContent(buf, v.Rule)
		case "domain":
			buf = appendJSONStringContent(buf, v.Domain)
		case "descriptor_index":
			buf = strconv.AppendInt(buf, int64(v.DescriptorIndex), 10)
		case "retry_after":
			buf = strconv.AppendInt(buf, v.RetryAfter, 10)
		}
	}
	return buf
}

// appendJSONStringContent appends s escaped for the inside of a JSON string.
func appendJSONStringContent(buf []byte, s string) []byte {
	q, _ := json.Marshal(s) // a string always marshals
	return append(buf, q[1:len(q)-1]...)
}
