package descriptors

import (
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/envoyrls/envoy-rls/pkg/algorithms"
)

// Config is a loaded, validated configuration: one Domain per domain name.
// It is read-only and safe for concurrent use.
type Config struct {
	domains  map[string]*Domain
	names    []string // sorted
	warnings Errors
}

// Warnings returns what Options.Lenient accepted that is refused by
// default, one "file:line: what was ignored or assumed" each, by file and
// line; nil without Options.Lenient. The caller must not modify it.
func (c *Config) Warnings() []*Error {
	if c == nil {
		return nil
	}
	return c.warnings
}

// Domain returns the domain with the given name, or nil when there is none.
// A nil *Config has no domains.
func (c *Config) Domain(name string) *Domain {
	if c == nil {
		return nil
	}
	return c.domains[name]
}

// Domains returns the names of the configured domains, sorted. The caller
// must not modify the returned slice.
func (c *Config) Domains() []string {
	if c == nil {
		return nil
	}
	return c.names
}

// Domain is the compiled descriptor tree of one domain.
type Domain struct {
	// Name is the domain name.
	Name string
	// File and Line say where the domain is defined.
	File string
	Line int
	// DefaultAlgorithm is the file's default_algorithm (FixedWindow when
	// not set).
	DefaultAlgorithm algorithms.Kind
	// DefaultUsageAccounting is the file's default_usage_accounting
	// (UsageUnset when not set), which applies to request limit overrides.
	DefaultUsageAccounting UsageAccounting
	// DefaultConsistency is the file's default_consistency
	// (ConsistencyUnset when not set): the consistency of its limits that
	// set none.
	DefaultConsistency Consistency

	root  level
	files map[*Node]string // the files of top-level nodes merged in from other files
	doc   int              // the domain's document in its file, from 1
}

// Entry is one key/value pair of a request descriptor.
type Entry struct {
	Key, Value string
}

// level is one level of the descriptor tree, by key.
type level map[string]*keyGroup

// keyGroup holds the nodes of one level that share a key.
type keyGroup struct {
	exact map[string]*Node // by value
	wild  []*Node          // wildcard values, in config order
	def   *Node            // the key-only node
}

// Node is one descriptor of the configuration, at some depth of its domain's
// tree.
type Node struct {
	// Key is the descriptor key.
	Key string
	// Value is the descriptor value: "" for a key-only (default) node, which
	// gives every distinct request value its own counter, or a pattern when
	// Wildcard is set.
	Value string
	// Wildcard reports whether Value contains '*' wildcards.
	Wildcard bool
	// Limits are the limits of the node, all of which must allow a request
	// (a composite when there are several). Empty for a node without a
	// limit: a whitelist, or a node that only holds nested descriptors.
	Limits []*RateLimit
	// ShadowMode, QuotaMode, DetailedMetric, ValueToMetric and ShareThreshold
	// are the node's flags of the same YAML names.
	ShadowMode     bool
	QuotaMode      bool
	DetailedMetric bool
	ValueToMetric  bool
	ShareThreshold bool
	// UsageAccounting says which charges to the node are usage accounting:
	// its own usage_accounting, else its nearest ancestor's, else the
	// file's default_usage_accounting; UsageUnset when none is set (the
	// service's default then decides). A quota_mode node accounts every
	// charge whatever it says (see pkg/rls).
	UsageAccounting UsageAccounting
	// Metadata is the node's metadata map, or nil when it has none.
	Metadata *structpb.Struct
	// Line is the line of the node in its file.
	Line int

	domain   string
	parent   *Node // nil at the top level
	depth    int   // 1 at the top level
	pattern  pattern
	children level

	statsKey      string // the stats key when no request value enters it
	valueToMetric bool   // value_to_metric applies at some level of the path
}

// RateLimit is one compiled rate limit of a Node.
type RateLimit struct {
	// Name is the limit's name (for replaces), or "".
	Name string
	// Unit is the upper-case unit name of the RLS protocol (SECOND, MINUTE,
	// HOUR, DAY, WEEK, MONTH, YEAR), or "" for a limit with a custom window
	// and for an unlimited one.
	Unit string
	// RequestsPerUnit is the number of requests allowed per unit or window.
	// Zero denies every request.
	RequestsPerUnit uint32
	// Unlimited reports a limit that always allows (no counter at all).
	// Limit and ID are zero-valued and "unlimited" for it.
	Unlimited bool
	// Replaces lists the names of limits this limit replaces.
	Replaces []string
	// Shadow reports a limit that is evaluated and reported but never
	// enforced: set by the limit's own shadow_mode or its node's.
	Shadow bool
	// Limit is the limit as the algorithms take it.
	Limit algorithms.Limit
	// ID identifies the limit's counter within its descriptor (see
	// CounterID): its algorithm and window, and its position among the
	// descriptor's limits with the same algorithm and window. It does not
	// depend on the name, the count (requests_per_unit, burst) or the
	// position in the file, so a counter keyed by it survives a reload that
	// renames, moves or re-counts the limit: a lowered limit applies at once
	// to what was already used.
	ID string
	// Consistency is the limit's consistency: its own, else its file's
	// default_consistency, else ConsistencyUnset (the service's default
	// decides). A sliding_window_log limit is always ConsistencyStrict
	// (see SupportsConsistency).
	Consistency Consistency
	// Line is the line of the limit in its file.
	Line int
}

// Match finds the descriptor a request descriptor selects, following the
// reference server: level by level, an entry selects the node with its key
// and exactly its value, else the first wildcard node of its key (in config
// order) whose pattern matches the value, else the key-only node of its key.
// There is no backtracking.
//
// Match appends the selected node of every level to path and returns it, so
// path[i] is the node for entries[i]. The limits of the last node apply (a
// node's limits apply only to requests with as many entries as its depth);
// when it has none the descriptor is allowed without a limit. Match returns
// nil when some entry selects no node (including when the request has more
// entries than the tree is deep along its way): no limit applies.
//
// Match does not allocate when path has room for len(entries) nodes. It is
// safe for concurrent use.
func (d *Domain) Match(entries []Entry, path []*Node) []*Node {
	if d == nil || len(entries) == 0 {
		return nil
	}
	lvl := d.root
	for i := range entries {
		e := &entries[i]
		g := lvl[e.Key]
		if g == nil {
			return nil
		}
		n := g.exact[e.Value]
		if n == nil {
			for _, w := range g.wild {
				if w.pattern.match(e.Value) {
					n = w
					break
				}
			}
		}
		if n == nil {
			n = g.def
		}
		if n == nil {
			return nil
		}
		path = append(path, n)
		lvl = n.children
	}
	return path
}

// pick returns the node of the group that value v selects: the node with
// exactly v, else the first wildcard node whose pattern matches v, else the
// key-only node; nil when there is none (or g is nil). Match has the same
// steps inline, on the request path.
func (g *keyGroup) pick(v string) *Node {
	if g == nil {
		return nil
	}
	if n := g.exact[v]; n != nil {
		return n
	}
	for _, w := range g.wild {
		if w.pattern.match(v) {
			return w
		}
	}
	return g.def
}

// CounterValue returns the value that identifies the counter of a request
// whose entry at n's level has value v: the pattern when n shares one
// counter among all matching values (share_threshold), otherwise v.
func (n *Node) CounterValue(v string) string {
	if n.ShareThreshold {
		return n.Value
	}
	return v
}

// StatsKey returns the reference server's statistics key for a request
// descriptor that Match resolved to a path ending at n: the domain, then per
// level "key" or "key_value" joined with dots, e.g. "domain.key1_value1.key2".
// A level's part is what the configuration says (the key, and the value or
// pattern when the node has one), except that:
//   - when n has detailed_metric, every level shows the request's value;
//   - a level whose node has value_to_metric shows the request's value;
//   - a level whose node has share_threshold always shows its pattern.
//
// A request value shows as "key_value", or "key" when it is empty. StatsKey
// allocates only when a request value enters the key.
func (n *Node) StatsKey(entries []Entry) string {
	if !(n.valueToMetric || n.DetailedMetric) || len(entries) != n.depth {
		return n.statsKey
	}
	size := len(n.statsKey) + n.depth // room for "_" + value at each level
	for _, e := range entries {
		size += len(e.Value)
	}
	var b strings.Builder
	b.Grow(size)
	b.WriteString(n.domain)
	n.writeStats(&b, n, entries)
	return b.String()
}

// writeStats writes the stats key parts of n's path (ancestors first) for
// a request resolved to leaf.
func (n *Node) writeStats(b *strings.Builder, leaf *Node, entries []Entry) {
	if n.parent != nil {
		n.parent.writeStats(b, leaf, entries)
	}
	b.WriteByte('.')
	b.WriteString(n.Key)
	v := n.Value
	if !n.ShareThreshold && (leaf.DetailedMetric || n.ValueToMetric) {
		v = entries[n.depth-1].Value
	}
	if v != "" {
		b.WriteByte('_')
		b.WriteString(v)
	}
}

// setStats computes n's static stats key and whether value_to_metric
// applies along its path. The parent must be done first.
func (n *Node) setStats() {
	prefix := n.domain
	if n.parent != nil {
		prefix, n.valueToMetric = n.parent.statsKey, n.parent.valueToMetric
	}
	n.statsKey = prefix + "." + n.Key
	if n.Value != "" {
		n.statsKey += "_" + n.Value
	}
	n.valueToMetric = n.valueToMetric || (n.ValueToMetric && !n.ShareThreshold)
}

// units are the units of the RLS protocol, with their windows. Month and
// year are fixed 30 and 365 days, as in the reference server.
var units = [...]struct {
	name   string
	window time.Duration
}{
	{"SECOND", time.Second},
	{"MINUTE", time.Minute},
	{"HOUR", time.Hour},
	{"DAY", 24 * time.Hour},
	{"WEEK", 7 * 24 * time.Hour},
	{"MONTH", 30 * 24 * time.Hour},
	{"YEAR", 365 * 24 * time.Hour},
}

// lookupUnit returns the canonical name and the window of a unit name
// (second, minute, hour, day, week, month = 30 days, year = 365 days; any
// letter case), and false for anything else.
func lookupUnit(unit string) (string, time.Duration, bool) {
	for _, u := range units {
		if strings.EqualFold(u.name, unit) {
			return u.name, u.window, true
		}
	}
	return "", 0, false
}
