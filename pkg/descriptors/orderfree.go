package descriptors

import (
	"fmt"
	"sort"
	"strings"
)

// Order-free matching, for the Rate Limit Quota Service (RLQS): Envoy names
// a quota bucket by a BucketId, a map from keys to values with no order, so
// a bucket selects a descriptor by walking the tree in whatever order its
// keys lead, each key used exactly once.

// MatchBucket finds the descriptor an unordered bucket selects: a path from
// the top of the tree that uses every entry of bucket exactly once, each
// level selecting its node among the nodes of one unused entry's key as
// Match does (exactly its value, else the first matching wildcard, else the
// key-only node; no retry on another node of the same key). The entries'
// keys must be distinct; their order does not matter.
//
// MatchBucket appends the path to path and the bucket's entries in the
// path's order to ordered, and returns both: ordered[i] is the entry of
// path[i], so ordered is the request descriptor Match would resolve to the
// same path (and the one whose counter an RLS request shares). It returns
// nil, nil when no path uses every entry. Among several paths it returns
// the first found trying the entries in their given order at each level; a
// configuration loaded with Options.OrderFree has at most one path with
// limits for any bucket (see CheckOrderFree).
//
// It is safe for concurrent use and allocates nothing when path and ordered
// have room for len(bucket) elements.
func (d *Domain) MatchBucket(bucket []Entry, ordered []Entry, path []*Node) ([]Entry, []*Node) {
	if d == nil || len(bucket) == 0 {
		return nil, nil
	}
	w := bucketWalk{bucket: bucket, ordered: ordered, path: path, base: len(ordered), baseP: len(path)}
	if len(bucket) > 64 {
		w.usedMore = make([]bool, len(bucket))
	}
	if !w.walk(d.root, 0) {
		return nil, nil
	}
	return w.ordered, w.path
}

// bucketWalk is the state of MatchBucket's search.
type bucketWalk struct {
	bucket      []Entry
	ordered     []Entry
	path        []*Node
	base, baseP int    // where this match starts in ordered and path
	used        uint64 // bucket entries on the path (the first 64)
	usedMore    []bool // instead of used, for more than 64 entries
}

func (w *bucketWalk) isUsed(i int) bool {
	if w.usedMore != nil {
		return w.usedMore[i]
	}
	return w.used&(1<<i) != 0
}

func (w *bucketWalk) setUsed(i int, on bool) {
	switch {
	case w.usedMore != nil:
		w.usedMore[i] = on
	case on:
		w.used |= 1 << i
	default:
		w.used &^= 1 << i
	}
}

// walk extends the path at depth with a node of lvl for each unused entry
// in turn, depth first, until every entry is used.
func (w *bucketWalk) walk(lvl level, depth int) bool {
	if depth == len(w.bucket) {
		return true
	}
	if len(lvl) == 0 {
		return false
	}
	for i := range w.bucket {
		if w.isUsed(i) {
			continue
		}
		e := w.bucket[i]
		n := lvl[e.Key].pick(e.Value)
		if n == nil {
			continue
		}
		w.setUsed(i, true)
		w.ordered = append(w.ordered[:w.base+depth], e)
		w.path = append(w.path[:w.baseP+depth], n)
		if w.walk(n.children, depth+1) {
			return true
		}
		w.setUsed(i, false)
	}
	return false
}

// CheckOrderFree reports every pair of descriptors of c that one bucket
// could select, walking the tree in two different key orders (MatchBucket
// would then depend on the order it tries the keys), where at least one of
// the two has limits; two descriptors without limits both just allow. One
// error per descriptor that has such a twin, at its line, naming the
// other. A configuration loaded with Options.OrderFree is refused with
// these errors.
//
// A value that an exact descriptor names is checked exactly. For two
// wildcard or key-only descriptors, a value is constructed that both
// patterns match and checked against the precedence of both levels; when
// that value is taken by another descriptor the pair is taken as disjoint.
func CheckOrderFree(c *Config) Errors {
	var errs Errors
	for _, name := range c.Domains() {
		errs = append(errs, c.domains[name].checkOrderFree()...)
	}
	return errs
}

// orderNode is a descriptor with the key order of its path.
type orderNode struct {
	n     *Node
	order string // the path's keys in order, NUL-joined
}

func (d *Domain) checkOrderFree() Errors {
	// Descriptors whose path repeats a key select no bucket (a BucketId
	// has each key once); the others, by key set.
	bySet := map[string][]orderNode{}
	var sets []string
	walkLevel(d.root, func(n *Node) {
		keys := make([]string, 0, n.depth)
		for p := n; p != nil; p = p.parent {
			keys = append(keys, p.Key)
		}
		for i, j := 0, len(keys)-1; i < j; i, j = i+1, j-1 {
			keys[i], keys[j] = keys[j], keys[i]
		}
		order := strings.Join(keys, "\x00")
		sorted := append([]string(nil), keys...)
		sort.Strings(sorted)
		for i := 1; i < len(sorted); i++ {
			if sorted[i] == sorted[i-1] {
				return
			}
		}
		set := strings.Join(sorted, "\x00")
		if _, ok := bySet[set]; !ok {
			sets = append(sets, set)
		}
		bySet[set] = append(bySet[set], orderNode{n: n, order: order})
	})
	var errs Errors
	reported := map[*Node]bool{}
	for _, set := range sets {
		byOrder := map[string][]*Node{}
		var orders []string
		for _, on := range bySet[set] {
			if _, ok := byOrder[on.order]; !ok {
				orders = append(orders, on.order)
			}
			byOrder[on.order] = append(byOrder[on.order], on.n)
		}
		// One order: a bucket selects one node per level, so one path.
		for i := range orders {
			for j := i + 1; j < len(orders); j++ {
				as, bs := byOrder[orders[i]], byOrder[orders[j]]
				if len(as) > len(bs) {
					as, bs = bs, as
				}
				bkeys := strings.Split(bs[0].keyOrder(), "\x00")
				for _, a := range as {
					d.twins(a, bkeys, func(b *Node) bool {
						if len(a.Limits) == 0 && len(b.Limits) == 0 {
							return true // both just allow
						}
						first, second := a, b
						if second.Line < first.Line || (second.Line == first.Line && d.NodeFile(second) < d.NodeFile(first)) {
							first, second = second, first
						}
						if reported[second] {
							return false
						}
						reported[second] = true
						errs = append(errs, &Error{File: d.NodeFile(second), Line: second.Line, Reason: fmt.Sprintf(
							"domain %q: a quota bucket with the keys %s selects both this descriptor (keys in the order %s) and the one at %s:%d (in the order %s); an RLQS bucket has no key order, so one of them must go or their values must not overlap",
							d.Name, keyList(strings.Split(set, "\x00")), keyList(pathKeys(second)), d.NodeFile(first), first.Line, keyList(pathKeys(first)))})
						return false
					})
				}
			}
		}
	}
	errs.sortByLine()
	return errs
}

// keyOrder returns the keys of n's path in order, NUL-joined.
func (n *Node) keyOrder() string { return strings.Join(pathKeys(n), "\x00") }

// twins calls fn with every node that a bucket selecting a's path could
// also select walking the keys in the order keys (the same keys as a's
// path, in another order), until fn returns false.
func (d *Domain) twins(a *Node, keys []string, fn func(b *Node) bool) {
	along := map[string]*Node{} // a's node of each key
	for p := a; p != nil; p = p.parent {
		along[p.Key] = p
	}
	var walk func(lvl level, i int) bool
	walk = func(lvl level, i int) bool {
		g := lvl[keys[i]]
		if g == nil {
			return true
		}
		an := along[keys[i]]
		next := func(c *Node) bool {
			if i == len(keys)-1 {
				return fn(c)
			}
			return walk(c.children, i+1)
		}
		if an.Value != "" && !an.Wildcard {
			if c := g.pick(an.Value); c != nil && d.valueSelectsBoth(an, c) {
				return next(c)
			}
			return true
		}
		for _, c := range g.nodes() {
			if d.valueSelectsBoth(an, c) && !next(c) {
				return false
			}
		}
		return true
	}
	walk(d.root, 0)
}

// group returns the key group n belongs to.
func (d *Domain) group(n *Node) *keyGroup {
	if n.parent == nil {
		return d.root[n.Key]
	}
	return n.parent.children[n.Key]
}

// valueSelectsBoth reports whether one value selects a in its group and b
// in its group (a and b have the same key).
func (d *Domain) valueSelectsBoth(a, b *Node) bool {
	ga, gb := d.group(a), d.group(b)
	selects := func(v string) bool { return ga.pick(v) == a && gb.pick(v) == b }
	switch {
	case a.Value != "" && !a.Wildcard:
		return selects(a.Value)
	case b.Value != "" && !b.Wildcard:
		return selects(b.Value)
	}
	v, ok := witness(a, b)
	return ok && selects(v)
}

// witness builds a value that the patterns of two wildcard or key-only
// nodes both match (a key-only node matches anything), if there is one
// with their prefixes and suffixes: the longer prefix, every middle part of
// both, the longer suffix, with a NUL byte between the parts so that no
// exact value is likely to equal it.
func witness(a, b *Node) (string, bool) {
	pa, pb := nodePattern(a), nodePattern(b)
	pre, ok := longer(pa.prefix, pb.prefix, strings.HasPrefix)
	if !ok {
		return "", false
	}
	suf, ok := longer(pa.suffix, pb.suffix, strings.HasSuffix)
	if !ok {
		return "", false
	}
	var s strings.Builder
	s.WriteString(pre)
	s.WriteByte(0)
	for _, m := range pa.middle {
		s.WriteString(m)
		s.WriteByte(0)
	}
	for _, m := range pb.middle {
		s.WriteString(m)
		s.WriteByte(0)
	}
	s.WriteString(suf)
	return s.String(), true
}

func nodePattern(n *Node) pattern {
	if n.Wildcard {
		return n.pattern
	}
	return pattern{} // key-only: matches anything
}

// longer returns the longer of x and y when the shorter is a prefix (or,
// with strings.HasSuffix, a suffix) of it.
func longer(x, y string, has func(s, part string) bool) (string, bool) {
	if len(x) < len(y) {
		x, y = y, x
	}
	return x, has(x, y)
}

func pathKeys(n *Node) []string {
	var keys []string
	for p := n; p != nil; p = p.parent {
		keys = append([]string{p.Key}, keys...)
	}
	return keys
}

func keyList(keys []string) string {
	q := make([]string, len(keys))
	for i, k := range keys {
		q[i] = fmt.Sprintf("%q", k)
	}
	return "[" + strings.Join(q, ", ") + "]"
}
