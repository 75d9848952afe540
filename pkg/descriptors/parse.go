package descriptors

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/envoyrls/envoy-rls/pkg/algorithms"
)

// MaxSlidingLogRequests bounds requests_per_unit for sliding_window_log,
// whose state keeps one entry per request in the window.
const MaxSlidingLogRequests = 100000

// The fields each mapping of the format may hold.
var (
	topFields   = []string{"domain", "descriptors", "default_algorithm", "default_usage_accounting", "default_consistency", "tiers", "name"} // name: the xDS resource name Envoy Gateway's dumps carry; ignored
	nodeFields  = []string{"key", "value", "rate_limit", "rate_limits", "tier", "descriptors", "shadow_mode", "quota_mode", "detailed_metric", "value_to_metric", "share_threshold", "metadata", "usage_accounting"}
	limitFields = []string{"unit", "requests_per_unit", "unlimited", "name", "replaces", "algorithm", "burst", "window", "shadow_mode", "consistency"}
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
	usage  UsageAccounting         // default_usage_accounting
	cons   Consistency             // default_consistency
	tiers  map[string][]*RateLimit // by name
	domain string

	// lenient accepts what the reference server's checker accepts, with
	// its meaning, and records a warning for each such thing in warns
	// (see Options.Lenient).
	lenient bool
	warns   Errors
}

// parseFile reads one configuration file: one YAML document, or several
// separated by ---, one domain each (Envoy Gateway dumps the configs it
// serves that way). It returns the domains (without those that have no
// usable domain name), every error found and, when lenient, the warnings.
//
// When lenient, a document after the first that does not load is skipped
// with its errors as warnings (the reference reads only the first
// document of a file), and so is the rest of the file after a YAML error
// in a later document.
func parseFile(file string, data []byte, lenient bool) ([]*Domain, Errors, Errors) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var (
		domains []*Domain
		errs    Errors
		warns   Errors
		docs    int
		budget  = maxAliasNodes // nodes aliases may add, in the whole file
	)
	for {
		var doc yaml.Node
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			break
		}
		p := &parser{file: file, lenient: lenient}
		if err != nil {
			p.yamlError(data, err)
			if lenient && docs > 0 {
				warns = append(warns, skipped(docs+1, p.errs, "the rest of the file")...)
			} else {
				errs = append(errs, p.errs...)
			}
			break
		}
		if docs > 0 && isNull(resolve(doc.Content[0])) {
			continue // an empty document after ---
		}
		docs++
		d := p.document(&doc, &budget)
		if lenient && docs > 1 && len(p.errs) > 0 {
			warns = append(warns, skipped(docs, p.errs, "it")...)
			continue
		}
		if d != nil {
			d.doc = docs
			domains = append(domains, d)
		}
		errs = append(errs, p.errs...)
		warns = append(warns, p.warns...)
	}
	if docs == 0 && len(errs) == 0 {
		errs = append(errs, &Error{File: file, Reason: "config is empty"})
	}
	errs.sortByLine()
	warns.sortByLine()
	return domains, errs, warns
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

// document reads one YAML document (never empty: the caller skips those).
// budget is how many nodes aliases may still add in the file; the
// document's expansion is taken from it.
func (p *parser) document(doc *yaml.Node, budget *int) *Domain {
	literal := literalSize(doc)
	expanded := expandedSize(doc, literal+*budget, map[*yaml.Node]int{})
	if expanded > literal+*budget {
		// Aliases can make a small file stand for an enormous tree (the
		// "billion laughs"): refuse it before walking it. Only what the
		// aliases add counts, so a large config without aliases loads.
		p.errorf(doc.Line, "aliases add more than %d nodes to the file", maxAliasNodes)
		*budget = 0
		return nil
	}
	*budget -= expanded - literal
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
	p.usage = p.usageAccounting(fs["default_usage_accounting"], "default_usage_accounting")
	p.cons = p.consistency(fs["default_consistency"], "default_consistency")
	p.readTiers(fs["tiers"])
	tree := p.descriptors(fs["descriptors"], nil)
	if d != nil {
		d.DefaultAlgorithm = p.alg
		d.DefaultUsageAccounting = p.usage
		d.DefaultConsistency = p.cons
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
