package descriptors

import (
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/envoyrls/envoy-rls/pkg/algorithms"
)

// Walk calls fn for every node of every domain: domains in name order, and
// within a domain the nodes in file order, each before its children.
func (c *Config) Walk(fn func(d *Domain, n *Node)) {
	for _, name := range c.Domains() {
		d := c.domains[name]
		walkLevel(d.root, func(n *Node) { fn(d, n) })
	}
}

func walkLevel(l level, fn func(*Node)) {
	var nodes []*Node
	for _, g := range l {
		if g.def != nil {
			nodes = append(nodes, g.def)
		}
		nodes = append(nodes, g.wild...)
		for _, n := range g.exact {
			nodes = append(nodes, n)
		}
	}
	sort.Slice(nodes, func(i, j int) bool {
		if nodes[i].Line != nodes[j].Line {
			return nodes[i].Line < nodes[j].Line
		}
		return nodes[i].Key+"\x00"+nodes[i].Value < nodes[j].Key+"\x00"+nodes[j].Value
	})
	for _, n := range nodes {
		fn(n)
		walkLevel(n.children, fn)
	}
}

// FullKey returns the node's full key as the reference server names it in its
// statistics and in /rlconfig: the domain, then "key" or "key_value" per
// level, joined with dots.
func (n *Node) FullKey() string { return n.statsKey }

// Dump writes one line per limit, as the reference server's /rlconfig does
// ("KEY: unit=UNIT requests_per_unit=N, shadow_mode: B, quota_mode: B").
// A limit with a custom window shows it as unit=<duration>; an unlimited one
// as unit=UNKNOWN requests_per_unit=0, as the reference prints it; a limit
// with another algorithm than fixed_window adds ", algorithm: NAME", and one
// with a consistency of its own or its file's ", consistency: NAME".
func (c *Config) Dump(w io.Writer) error {
	var b strings.Builder
	c.Walk(func(_ *Domain, n *Node) {
		for _, l := range n.Limits {
			unit, rpu := l.Unit, l.RequestsPerUnit
			switch {
			case l.Unlimited:
				unit, rpu = "UNKNOWN", 0
			case unit == "":
				unit = l.Limit.Window.String()
			}
			fmt.Fprintf(&b, "%s: unit=%s requests_per_unit=%d, shadow_mode: %t, quota_mode: %t", n.statsKey, unit, rpu, l.Shadow, n.QuotaMode)
			if !l.Unlimited && l.Limit.Algorithm != algorithms.FixedWindow {
				fmt.Fprintf(&b, ", algorithm: %s", l.Limit.Algorithm)
			}
			if l.Consistency != ConsistencyUnset {
				fmt.Fprintf(&b, ", consistency: %s", l.Consistency)
			}
			b.WriteByte('\n')
		}
	})
	_, err := io.WriteString(w, b.String())
	return err
}
