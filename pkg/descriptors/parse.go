package descriptors

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/structpb"
	"gopkg.in/yaml.v3"

	"github.com/envoyrls/envoy-rls/pkg/algorithms"
)

// MaxSlidingLogRequests bounds requests_per_unit for sliding_window_log,
// whose state keeps one entry per request in the window.
const MaxSlidingLogRequests = 100000

// The fields each mapping of the format may hold.
var (
	topFields   = []string{"domain", "descriptors", "default_algorithm", "tiers", "name"} // name: the xDS resource name Envoy Gateway's dumps carry; ignored
	nodeFields  = []string{"key", "value", "rate_limit", "rate_limits", "tier", "descriptors", "shadow_mode", "quota_mode", "detailed_metric", "value_to_metric", "share_threshold", "metadata"}
	limitFields = []string{"unit", "requests_per_unit", "unlimited", "name", "replaces", "algorithm", "burst", "window", "shadow_mode"}
)

// algorithmNames lists the algorithm names for error messages.
var algorithmNames = func() string {
	var names []string
	for _, k := range algorithms.Kinds() {
		names = append(names, k.String())
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}()

// parser reads one file. It walks yaml.v3 node trees itself to know the line
// of everything, and collects every error instead of stopping at the first.
type parser struct {
	file   string
	errs   Errors
	alg    algorithms.Kind         // default_algorithm
	tiers  map[string][]*RateLimit // by name
	domain string
}

// parseFile reads one configuration document. It returns the domain (nil
// when the document has no usable domain name) and every error found.
func parseFile(file string, data []byte) (*Domain, Errors) {
	p := &parser{file: file}
	d := p.document(data)
	p.errs.sortByLine()
	return d, p.errs
}

func (p *parser) errorf(line int, format string, args ...any) {
	p.errs = append(p.errs, &Error{File: p.file, Line: line, Reason: fmt.Sprintf(format, args...)})
}

var yamlLineError = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// yamlError reports an error of the YAML parser of data at the line where
// it is (see syntaxErrorLine).
func (p *parser) yamlError(data []byte, err error) {
	line, reason := splitYAMLError(err)
	if l := syntaxErrorLine(data, reason); l > 0 {
		line = l
	}
	if strings.Contains(reason, "tab character") {
		reason += " (indent with spaces)"
	}
	p.errorf(line, "invalid YAML: %s", reason)
}

// splitYAMLError splits an error of yaml.v3 into the line it names (0 when
// none) and the reason.
func splitYAMLError(err error) (int, string) {
	msg := err.Error()
	if m := yamlLineError.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		return line, m[2]
	}
	return 0, strings.TrimPrefix(msg, "yaml: ")
}

// syntaxErrorLine returns the line of data on which the YAML error with
// this reason is, or 0 when it cannot tell.
//
// yaml.v3 reports the line where the enclosing construct starts (a
// mis-indented key on line 7 of a mapping opened on line 2 is reported on
// line 2, a tab is reported on the line before it) and some errors without a
// line at all. The parser reads its input as a stream, so the first k lines
// of data fail with the same reason exactly when the problem is on one of
// them: the line is the smallest such k, found by bisection (each step
// parses a prefix; this runs only for a file that is already invalid).
func syntaxErrorLine(data []byte, reason string) int {
	var ends []int // ends[i] is the length of the first i+1 lines
	for i, c := range data {
		if c == '\n' {
			ends = append(ends, i+1)
		}
	}
	if len(ends) == 0 || ends[len(ends)-1] != len(data) {
		ends = append(ends, len(data))
	}
	fails := func(k int) bool { // the first k lines fail with reason
		dec := yaml.NewDecoder(bytes.NewReader(data[:ends[k-1]]))
		for {
			var n yaml.Node
			err := dec.Decode(&n)
			if err == nil {
				continue
			}
			if errors.Is(err, io.EOF) {
				return false
			}
			_, r := splitYAMLError(err)
			return r == reason
		}
	}
	lo, hi := 1, len(ends) // the answer is in [lo, hi] if fails(hi)
	if !fails(hi) {
		return 0
	}
	for lo < hi {
		mid := lo + (hi-lo)/2
		if fails(mid) {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo
}

func (p *parser) document(data []byte) *Domain {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			p.errorf(0, "config is empty")
		} else {
			p.yamlError(data, err)
		}
		return nil
	}
	var next yaml.Node
	switch err := dec.Decode(&next); {
	case err == nil:
		p.errorf(next.Line, "more than one YAML document (one domain per file)")
	case !errors.Is(err, io.EOF):
		p.yamlError(data, err)
	}
	if literal := literalSize(&doc); expandedSize(&doc, literal+maxAliasNodes, map[*yaml.Node]int{}) > literal+maxAliasNodes {
		// Aliases can make a small file stand for an enormous tree (the
		// "billion laughs"): refuse it before walking it. Only what the
		// aliases add counts, so a large config without aliases loads.
		p.errorf(doc.Line, "aliases add more than %d nodes to the document", maxAliasNodes)
		return nil
	}
	root := resolve(doc.Content[0])
	if isNull(root) {
		p.errorf(0, "config is empty")
		return nil
	}
	if root.Kind != yaml.MappingNode {
		p.errorf(root.Line, "config must be a mapping with domain and descriptors, got %s", describe(root))
		return nil
	}
	fs := p.fields(root, "config", topFields)

	var d *Domain
	switch f := fs["domain"]; {
	case f.key == nil:
		p.errorf(root.Line, "domain is required")
	case isEmpty(f.val):
		p.errorf(f.key.Line, "domain must not be empty")
	default:
		if name, ok := p.str(f, "domain"); ok {
			d = &Domain{Name: name, File: p.file, Line: f.key.Line}
			p.domain = name
		}
	}

	if f := fs["default_algorithm"]; f.val != nil {
		p.alg, _ = p.algorithm(f, "default_algorithm")
	}
	p.readTiers(fs["tiers"])
	tree := p.descriptors(fs["descriptors"], nil)
	if d != nil {
		d.DefaultAlgorithm = p.alg
		d.root = tree
	}
	return d
}

// maxAliasNodes bounds the nodes that aliases add to a document when they
// are expanded. Real configs stay far below it; the document's own size is
// bounded only by the file's.
const maxAliasNodes = 1_000_000

// literalSize returns the number of nodes of n as written, an alias counting
// as one node.
func literalSize(n *yaml.Node) int {
	size := 1
	for _, c := range n.Content {
		size += literalSize(c)
	}
	return size
}

// expandedSize returns the number of nodes of n with every alias expanded,
// or a number above bound once it passes bound. It visits each node once
// (memo), so a small document cannot make it slow.
func expandedSize(n *yaml.Node, bound int, memo map[*yaml.Node]int) int {
	if v, ok := memo[n]; ok {
		return v
	}
	memo[n] = bound + 1 // a cycle counts as too large
	size := 1
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		size += expandedSize(n.Alias, bound, memo)
	}
	for _, c := range n.Content {
		if size > bound {
			break
		}
		size += expandedSize(c, bound, memo)
	}
	size = min(size, bound+1)
	memo[n] = size
	return size
}

// field is one key of a mapping and its value. val is nil when the key is
// absent or its value is null: null means "not set" throughout the format,
// as it does for the reference server.
type field struct {
	key, val *yaml.Node
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
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := resolve(n.Content[i]), resolve(n.Content[i+1])
		if k.Kind != yaml.ScalarNode {
			p.errorf(k.Line, "field names must be strings, got %s", describe(k))
			continue
		}
		name := k.Value
		if !contains(allowed, name) {
			p.errorf(k.Line, "unknown field %q in %s", name, what)
			continue
		}
		if prev, ok := fs[name]; ok {
			p.errorf(k.Line, "duplicate field %q (first at line %d)", name, prev.key.Line)
			continue
		}
		if isNull(v) {
			v = nil
		}
		fs[name] = field{key: k, val: v}
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

// readTiers reads the tiers: a mapping of name to a list of rate limits.
func (p *parser) readTiers(f field) {
	p.tiers = map[string][]*RateLimit{}
	if f.val == nil {
		return
	}
	if f.val.Kind != yaml.MappingNode {
		p.errorf(f.key.Line, "tiers must be a mapping of name to rate limits, got %s", describe(f.val))
		return
	}
	seen := map[string]int{}
	for i := 0; i+1 < len(f.val.Content); i += 2 {
		k := resolve(f.val.Content[i])
		if k.Kind != yaml.ScalarNode {
			p.errorf(k.Line, "tier names must be strings, got %s", describe(k))
			continue
		}
		name := k.Value
		if line, ok := seen[name]; ok {
			p.errorf(k.Line, "duplicate tier %q (first at line %d)", name, line)
			continue
		}
		seen[name] = k.Line
		if name == "" {
			p.errorf(k.Line, "tier name must not be empty")
			continue
		}
		v := resolve(f.val.Content[i+1])
		if isNull(v) {
			v = nil
		}
		// The tier is known even when invalid, so that its users do not
		// also report an unknown tier.
		p.tiers[name] = p.limitList(field{key: k, val: v}, fmt.Sprintf("tier %q", name))
	}
}

// limitList reads a non-empty list of rate limits (rate_limits or a tier).
func (p *parser) limitList(f field, what string) []*RateLimit {
	if f.val == nil || (f.val.Kind == yaml.SequenceNode && len(f.val.Content) == 0) {
		p.errorf(f.key.Line, "%s must not be empty", what)
		return nil
	}
	if f.val.Kind != yaml.SequenceNode {
		p.errorf(f.key.Line, "%s must be a list of rate limits, got %s", what, describe(f.val))
		return nil
	}
	var out []*RateLimit
	for _, item := range f.val.Content {
		item = resolve(item)
		l := p.rateLimit(item)
		if l == nil {
			continue
		}
		if l.Unlimited && len(f.val.Content) > 1 {
			p.errorf(item.Line, "an unlimited rate limit must be the only one in %s", what)
			continue
		}
		out = append(out, l)
	}
	return out
}

// rateLimit reads one rate limit. It returns nil when the limit is invalid.
func (p *parser) rateLimit(n *yaml.Node) *RateLimit {
	if n.Kind != yaml.MappingNode {
		p.errorf(n.Line, "rate limit must be a mapping, got %s", describe(n))
		return nil
	}
	start := len(p.errs)
	fs := p.fields(n, "rate limit", limitFields)
	l := &RateLimit{Line: n.Line}
	l.Name, _ = p.str(fs["name"], "name")
	l.Shadow = p.boolean(fs["shadow_mode"], "shadow_mode")
	l.Replaces = p.replaces(fs["replaces"], l.Name)
	l.Unlimited = p.boolean(fs["unlimited"], "unlimited")
	if l.Unlimited {
		for _, name := range []string{"unit", "requests_per_unit", "algorithm", "burst", "window"} {
			if f := fs[name]; f.val != nil {
				p.errorf(f.key.Line, "unlimited must not be combined with %s", name)
			}
		}
		l.ID = "unlimited"
		return p.valid(l, start)
	}

	alg, algOK := p.alg, true
	if f := fs["algorithm"]; f.val != nil {
		alg, algOK = p.algorithm(f, "algorithm")
	}
	l.Limit.Algorithm = alg

	switch unit, window := fs["unit"], fs["window"]; {
	case unit.val != nil && window.val != nil:
		p.errorf(window.key.Line, "unit and window are mutually exclusive")
	case unit.val != nil:
		if s, ok := p.str(unit, "unit"); ok {
			name, w, ok := lookupUnit(s)
			if !ok {
				p.errorf(unit.key.Line, "invalid unit %q (want second, minute, hour, day, week, month or year)", s)
			}
			l.Unit, l.Limit.Window = name, w
		}
	case window.val != nil:
		if s, ok := p.str(window, "window"); ok {
			w, err := time.ParseDuration(s)
			switch {
			case err != nil:
				p.errorf(window.key.Line, "window %q is not a duration like 90s or 1h30m", s)
			case w < time.Millisecond:
				p.errorf(window.key.Line, "window %s is shorter than 1ms", s)
			}
			l.Limit.Window = w
		}
	default:
		p.errorf(n.Line, "rate limit needs a unit or a window")
	}

	// A requests_per_unit of 0 is accepted, as the reference server does:
	// such a limit denies every request (a block list entry).
	if f := fs["requests_per_unit"]; f.val == nil {
		p.errorf(n.Line, "rate limit needs requests_per_unit")
	} else if v, ok := p.integer(f, "requests_per_unit", 0, math.MaxUint32); ok {
		l.RequestsPerUnit = uint32(v)
		l.Limit.Requests = uint64(v)
		if alg == algorithms.SlidingWindowLog && v > MaxSlidingLogRequests {
			p.errorf(f.key.Line, "requests_per_unit must be at most %d for sliding_window_log, which keeps one entry per request, got %d", MaxSlidingLogRequests, v)
		}
	}

	if f := fs["burst"]; f.val != nil {
		if v, ok := p.integer(f, "burst", 1, math.MaxUint32); ok {
			if algOK && !alg.HasBurst() {
				p.errorf(f.key.Line, "burst has no meaning for %s (only for token_bucket and gcra)", alg)
			} else if l.RequestsPerUnit == 0 && fs["requests_per_unit"].val != nil {
				p.errorf(f.key.Line, "burst has no meaning with requests_per_unit 0, which denies every request")
			}
			l.Limit.Burst = uint64(v)
		}
	}
	l.ID = CounterID(l.Limit, 0) // numbered among its siblings by nodeLimits
	return p.valid(l, start)
}

// valid returns l when no error was reported since start, else nil.
func (p *parser) valid(l *RateLimit, start int) *RateLimit {
	if len(p.errs) > start {
		return nil
	}
	return l
}

// CounterID is the identity of the counter of a limit: its algorithm and
// window, and n, its position among the limits of its descriptor with the
// same algorithm and window (0 for the first). It leaves out the limit's
// count (requests_per_unit, burst) on purpose: usage belongs to the
// descriptor, so a reload or a request override that changes the count
// applies it to what was already used. The state of every algorithm is kept
// in units that do not depend on the count (hits, or token·µs of debt), so
// it carries over unconverted. Only a change of algorithm or window (whose
// state means something else) starts a fresh counter. The parts contain no
// ':' or '#', so different (algorithm, window, n) never share an ID.
func CounterID(l algorithms.Limit, n int) string {
	id := l.Algorithm.String() + ":" + l.Window.String()
	if n > 0 {
		id += "#" + strconv.Itoa(n)
	}
	return id
}

// replaces reads a replaces list: [{name: X}, ...].
func (p *parser) replaces(f field, own string) []string {
	if f.val == nil {
		return nil
	}
	if f.val.Kind != yaml.SequenceNode {
		p.errorf(f.key.Line, "replaces must be a list, got %s", describe(f.val))
		return nil
	}
	var out []string
	for _, item := range f.val.Content {
		item = resolve(item)
		if item.Kind != yaml.MappingNode {
			p.errorf(item.Line, "replaces entry must be a mapping with a name, got %s", describe(item))
			continue
		}
		fs := p.fields(item, "replaces entry", []string{"name"})
		name, ok := p.str(fs["name"], "name")
		switch {
		case !ok && fs["name"].val != nil: // already reported
		case name == "":
			p.errorf(item.Line, "replaces entry has an empty name")
		case name == own:
			p.errorf(item.Line, "rate limit %q replaces its own name", own)
		default:
			out = append(out, name)
		}
	}
	return out
}

// descriptors reads a list of descriptors below parent (nil at the top).
func (p *parser) descriptors(f field, parent *Node) level {
	if f.val == nil {
		return nil
	}
	if f.val.Kind != yaml.SequenceNode {
		p.errorf(f.key.Line, "descriptors must be a list, got %s", describe(f.val))
		return nil
	}
	lvl := level{}
	seen := map[Entry]int{} // key and value ("" for none) -> line
	for _, item := range f.val.Content {
		item = resolve(item)
		if item.Kind != yaml.MappingNode {
			p.errorf(item.Line, "descriptor must be a mapping, got %s", describe(item))
			continue
		}
		n := p.node(item, parent)
		if n == nil {
			continue
		}
		k := Entry{n.Key, n.Value}
		if line, ok := seen[k]; ok {
			if n.Value == "" {
				p.errorf(n.Line, "duplicate descriptor with key %q and no value (first at line %d)", n.Key, line)
			} else {
				p.errorf(n.Line, "duplicate descriptor with key %q and value %q (first at line %d)", n.Key, n.Value, line)
			}
			continue
		}
		seen[k] = n.Line
		lvl.add(n)
	}
	return lvl
}

func (l level) add(n *Node) {
	g := l[n.Key]
	if g == nil {
		g = &keyGroup{}
		l[n.Key] = g
	}
	switch {
	case n.Value == "":
		g.def = n
	case n.Wildcard:
		g.wild = append(g.wild, n)
	default:
		if g.exact == nil {
			g.exact = map[string]*Node{}
		}
		g.exact[n.Value] = n
	}
}

// node reads one descriptor and its children. It returns nil when the
// descriptor has no usable key or value (its contents are still checked).
func (p *parser) node(m *yaml.Node, parent *Node) *Node {
	fs := p.fields(m, "descriptor", nodeFields)
	n := &Node{Line: m.Line, parent: parent, depth: 1, domain: p.domain}
	if parent != nil {
		n.depth = parent.depth + 1
	}
	keyOK := false
	switch f := fs["key"]; {
	case f.key == nil:
		p.errorf(m.Line, "descriptor has no key")
	case isEmpty(f.val):
		p.errorf(f.key.Line, "descriptor key must not be empty")
	default:
		n.Key, keyOK = p.str(f, "key")
	}
	// An empty value is no value, as for the reference server.
	value, valueOK := p.str(fs["value"], "value")
	n.Value, valueOK = value, valueOK || fs["value"].val == nil // unset is fine
	n.Wildcard = strings.Contains(n.Value, "*")
	if n.Wildcard {
		n.pattern = compilePattern(n.Value)
	}
	n.ShadowMode = p.boolean(fs["shadow_mode"], "shadow_mode")
	n.QuotaMode = p.boolean(fs["quota_mode"], "quota_mode")
	n.DetailedMetric = p.boolean(fs["detailed_metric"], "detailed_metric")
	n.ValueToMetric = p.boolean(fs["value_to_metric"], "value_to_metric")
	n.ShareThreshold = p.boolean(fs["share_threshold"], "share_threshold")
	if n.ShareThreshold && !n.Wildcard {
		p.errorf(fs["share_threshold"].key.Line, "share_threshold requires a wildcard value (with '*')")
	}
	n.Metadata = p.metadata(fs["metadata"])
	n.Limits = p.nodeLimits(fs, n.ShadowMode)
	n.setStats()
	n.children = p.descriptors(fs["descriptors"], n)
	if !keyOK || !valueOK {
		return nil
	}
	return n
}

// nodeLimits reads the limits of a descriptor: rate_limit, rate_limits or
// tier, at most one of them. Each node gets its own copies, so that Shadow
// can include the node's shadow_mode.
func (p *parser) nodeLimits(fs map[string]field, shadow bool) []*RateLimit {
	var limits []*RateLimit
	set := 0
	for _, name := range []string{"rate_limit", "rate_limits", "tier"} {
		f := fs[name]
		if f.val == nil {
			continue
		}
		if set++; set > 1 {
			p.errorf(f.key.Line, "only one of rate_limit, rate_limits and tier may be set")
		}
		var ls []*RateLimit
		switch name {
		case "rate_limit":
			if l := p.rateLimit(f.val); l != nil {
				ls = []*RateLimit{l}
			}
		case "rate_limits":
			ls = p.limitList(f, "rate_limits")
		case "tier":
			if t, ok := p.str(f, "tier"); ok {
				var known bool
				if ls, known = p.tiers[t]; !known {
					p.errorf(f.key.Line, "unknown tier %q", t)
				}
			}
		}
		if set == 1 {
			for _, l := range ls {
				c := *l
				c.Shadow = c.Shadow || shadow
				if !c.Unlimited {
					// Limits of one descriptor with the same algorithm and
					// window count apart.
					n := 0
					for _, o := range limits {
						if !o.Unlimited && o.Limit.Algorithm == c.Limit.Algorithm && o.Limit.Window == c.Limit.Window {
							n++
						}
					}
					c.ID = CounterID(c.Limit, n)
				}
				limits = append(limits, &c)
			}
		}
	}
	return limits
}

// metadata reads the metadata mapping of a descriptor.
func (p *parser) metadata(f field) *structpb.Struct {
	if f.val == nil {
		return nil
	}
	if f.val.Kind != yaml.MappingNode {
		p.errorf(f.key.Line, "metadata must be a mapping, got %s", describe(f.val))
		return nil
	}
	return p.value(f.val, 1).GetStructValue()
}

// MaxMetadataDepth bounds the nesting of a descriptor's metadata (a mapping
// or list inside another counts one level). The metadata goes into every
// response that passes the descriptor, and decoders refuse messages nested
// too deeply (protobuf's default recursion limit is 100 messages, and each
// level here is two).
const MaxMetadataDepth = 32

// value converts YAML to a protobuf Value: mappings to structs, lists to
// lists, and scalars by their YAML type. depth is the nesting level of n.
func (p *parser) value(n *yaml.Node, depth int) *structpb.Value {
	n = resolve(n)
	if depth > MaxMetadataDepth && (n.Kind == yaml.MappingNode || n.Kind == yaml.SequenceNode) {
		p.errorf(n.Line, "metadata is nested more than %d levels deep", MaxMetadataDepth)
		return structpb.NewNullValue()
	}
	switch n.Kind {
	case yaml.MappingNode:
		s := &structpb.Struct{Fields: make(map[string]*structpb.Value, len(n.Content)/2)}
		lines := map[string]int{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := resolve(n.Content[i])
			if k.Kind != yaml.ScalarNode {
				p.errorf(k.Line, "metadata keys must be strings, got %s", describe(k))
				continue
			}
			if line, ok := lines[k.Value]; ok {
				p.errorf(k.Line, "duplicate field %q (first at line %d)", k.Value, line)
				continue
			}
			lines[k.Value] = k.Line
			s.Fields[k.Value] = p.value(n.Content[i+1], depth+1)
		}
		return structpb.NewStructValue(s)
	case yaml.SequenceNode:
		l := &structpb.ListValue{Values: make([]*structpb.Value, 0, len(n.Content))}
		for _, c := range n.Content {
			l.Values = append(l.Values, p.value(c, depth+1))
		}
		return structpb.NewListValue(l)
	}
	switch n.ShortTag() {
	case "!!null":
		return structpb.NewNullValue()
	case "!!bool":
		var b bool
		if n.Decode(&b) == nil {
			return structpb.NewBoolValue(b)
		}
	case "!!int", "!!float":
		var f float64
		if n.Decode(&f) == nil {
			if math.IsInf(f, 0) || math.IsNaN(f) {
				p.errorf(n.Line, "metadata number %s is not finite", n.Value)
			}
			return structpb.NewNumberValue(f)
		}
	}
	return structpb.NewStringValue(n.Value)
}
