package rls

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// HeaderMode selects the quota fields added to responses through
// response_headers_to_add. Retry-After is added to every OVER_LIMIT answer
// whatever the mode.
type HeaderMode uint8

const (
	// HeadersOff adds no quota fields.
	HeadersOff HeaderMode = 0
	// HeadersLegacy adds RateLimit-Limit, RateLimit-Remaining and
	// RateLimit-Reset for the binding limit (the reference server's
	// LIMIT_RESPONSE_HEADERS_ENABLED).
	HeadersLegacy HeaderMode = 1 << iota
	// HeadersIETF adds the IETF httpapi RateLimit-Policy (every limit that
	// applied) and RateLimit (the binding one) fields.
	HeadersIETF
	// HeadersDraft03 adds X-RateLimit-Limit, X-RateLimit-Remaining and
	// X-RateLimit-Reset as Envoy's DRAFT_VERSION_03 builds them.
	HeadersDraft03
	// HeadersAll adds all three sets.
	HeadersAll = HeadersLegacy | HeadersIETF | HeadersDraft03
)

// ParseHeaderMode parses off, ietf, draft03, legacy or all; true and false
// (the flag's former boolean values) mean legacy and off.
func ParseHeaderMode(s string) (HeaderMode, error) {
	switch strings.ToLower(s) {
	case "off", "false", "":
		return HeadersOff, nil
	case "legacy", "true":
		return HeadersLegacy, nil
	case "ietf":
		return HeadersIETF, nil
	case "draft03":
		return HeadersDraft03, nil
	case "all":
		return HeadersAll, nil
	}
	return 0, fmt.Errorf("response headers %q: want off, ietf, draft03, legacy or all", s)
}

// MarshalText implements encoding.TextMarshaler (for flags).
func (m HeaderMode) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler with ParseHeaderMode.
func (m *HeaderMode) UnmarshalText(b []byte) error {
	v, err := ParseHeaderMode(string(b))
	if err != nil {
		return err
	}
	*m = v
	return nil
}

func (m HeaderMode) String() string {
	switch m {
	case HeadersOff:
		return "off"
	case HeadersLegacy:
		return "legacy"
	case HeadersIETF:
		return "ietf"
	case HeadersDraft03:
		return "draft03"
	case HeadersAll:
		return "all"
	}
	return "HeaderMode(" + strconv.Itoa(int(m)) + ")"
}

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
