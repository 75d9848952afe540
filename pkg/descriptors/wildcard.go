package descriptors

import "strings"

// pattern is a compiled wildcard value: '*' matches any run of bytes,
// including none. A value "a*b*c" compiles to prefix "a", middle ["b"] and
// suffix "c".
type pattern struct {
	prefix, suffix string
	middle         []string // non-empty, in order
	min            int      // the shortest length a match can have
}

func compilePattern(s string) pattern {
	parts := strings.Split(s, "*")
	p := pattern{prefix: parts[0], suffix: parts[len(parts)-1]}
	p.min = len(p.prefix) + len(p.suffix)
	for _, m := range parts[1 : len(parts)-1] {
		if m != "" {
			p.middle = append(p.middle, m)
			p.min += len(m)
		}
	}
	return p
}

// match reports whether v matches the pattern. Taking each middle part at
// its leftmost place is enough: it leaves the most room for the rest.
func (p *pattern) match(v string) bool {
	if len(v) < p.min || !strings.HasPrefix(v, p.prefix) || !strings.HasSuffix(v, p.suffix) {
		return false
	}
	rest := v[len(p.prefix) : len(v)-len(p.suffix)]
	for _, m := range p.middle {
		i := strings.Index(rest, m)
		if i < 0 {
			return false
		}
		rest = rest[i+len(m):]
	}
	return true
}
