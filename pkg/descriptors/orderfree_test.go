package descriptors

import (
	"fmt"
	"strings"
	"testing"
)

func parseOrderFree(doc string) (*Config, error) {
	return ParseDocumentsWith([]Document{{File: "q.yaml", Data: []byte(doc)}}, Options{OrderFree: true})
}

// TestMatchBucketOrderFree: a bucket selects the same descriptor whatever
// the order of its entries, each entry used once, and the entries come back
// in the path's order (the RLS descriptor that shares the counter).
func TestMatchBucketOrderFree(t *testing.T) {
	c, err := parseOrderFree(`
domain: q
descriptors:
  - key: tenant
    descriptors:
      - key: path
        value: /api
        rate_limit: {unit: second, requests_per_unit: 10}
      - key: path
        rate_limit: {unit: second, requests_per_unit: 5}
  - key: user
    value: "bot-*"
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 60}
`)
	if err != nil {
		t.Fatal(err)
	}
	d := mustDomain(t, c, "q")
	for i, tc := range []struct {
		bucket []string
		want   string // describePath
		order  string // the entries in path order
	}{
		{[]string{"tenant=a", "path=/api"}, "tenant=@4/path=/api@6", "tenant=a path=/api"},
		{[]string{"path=/api", "tenant=a"}, "tenant=@4/path=/api@6", "tenant=a path=/api"},
		{[]string{"path=/x", "tenant=a"}, "tenant=@4/path=@9", "tenant=a path=/x"},
		{[]string{"user=bot-7"}, "user=bot-*@11", "user=bot-7"},
		{[]string{"user=alice"}, "user=@14", "user=alice"},
		{[]string{"tenant=a"}, "tenant=@4", "tenant=a"},        // a node without limits
		{[]string{"tenant=a", "path=/x", "user=u"}, "nil", ""}, // an entry left over
		{[]string{"path=/x"}, "nil", ""},                       // no top-level path node
		{[]string{"tenant=a", "user=u"}, "nil", ""},            // user is not below tenant
		{nil, "nil", ""},
	} {
		bucket := entries(tc.bucket...)
		ordered, path := d.MatchBucket(bucket, nil, nil)
		if got := describePath(path); got != tc.want {
			t.Errorf("case %d %v: got %s, want %s", i, tc.bucket, got, tc.want)
		}
		var parts []string
		for _, e := range ordered {
			parts = append(parts, e.Key+"="+e.Value)
		}
		if got := strings.Join(parts, " "); got != tc.order {
			t.Errorf("case %d %v: entries %q, want %q", i, tc.bucket, got, tc.order)
		}
		if path != nil {
			// The ordered entries are what Match resolves to the same path.
			if again := describePath(d.Match(ordered, nil)); again != tc.want {
				t.Errorf("case %d: Match(ordered) = %s, want %s", i, again, tc.want)
			}
		}
	}
}

// TestMatchBucketAppends: MatchBucket appends after what the slices hold
// and allocates nothing with room.
func TestMatchBucketAppends(t *testing.T) {
	d := mustDomain(t, mustParse(t, `
domain: q
descriptors:
  - key: a
    descriptors:
      - key: b
        descriptors:
          - key: c
            rate_limit: {unit: second, requests_per_unit: 1}
`), "q")
	bucket := entries("c=3", "b=2", "a=1")
	ordered := append(make([]Entry, 0, 8), Entry{"x", "y"})
	path := make([]*Node, 0, 8)
	ordered, path = d.MatchBucket(bucket, ordered, path)
	if len(ordered) != 4 || ordered[0] != (Entry{"x", "y"}) || ordered[1].Key != "a" || ordered[3].Key != "c" || len(path) != 3 {
		t.Fatalf("ordered %v, path %s", ordered, describePath(path))
	}
	allocs := testing.AllocsPerRun(100, func() {
		d.MatchBucket(bucket, ordered[:0], path[:0])
	})
	if allocs != 0 {
		t.Errorf("MatchBucket allocates %v times per call with room", allocs)
	}
}

// TestMatchBucketManyEntries: more than 64 entries are tracked too.
func TestMatchBucketManyEntries(t *testing.T) {
	var b strings.Builder
	b.WriteString("domain: q\ndescriptors:\n")
	indent := ""
	const n = 70
	for i := range n {
		fmt.Fprintf(&b, "%s  - key: k%02d\n", indent, i)
		if i == n-1 {
			fmt.Fprintf(&b, "%s    rate_limit: {unit: second, requests_per_unit: 1}\n", indent)
		} else {
			fmt.Fprintf(&b, "%s    descriptors:\n", indent)
		}
		indent += "    "
	}
	d := mustDomain(t, mustParse(t, b.String()), "q")
	var bucket []Entry
	for i := n - 1; i >= 0; i-- {
		bucket = append(bucket, Entry{fmt.Sprintf("k%02d", i), "v"})
	}
	if _, path := d.MatchBucket(bucket, nil, nil); len(path) != n || len(path[n-1].Limits) != 1 {
		t.Fatalf("got a path of %d nodes", len(path))
	}
	if _, path := d.MatchBucket(bucket[1:], nil, nil); path != nil && len(path[len(path)-1].Limits) != 0 {
		t.Fatalf("69 entries reached the limit at depth 70")
	}
}

// TestOrderFreeRefusesTwoWays: a config where one bucket selects two
// descriptors through different key orders is refused with both lines;
// one where values keep them apart, or neither has a limit, loads.
func TestOrderFreeRefusesTwoWays(t *testing.T) {
	for i, tc := range []struct {
		doc  string
		want string // the error, or "" when the config loads
	}{{
		doc: `
domain: q
descriptors:
  - key: a
    descriptors:
      - key: b
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: b
    descriptors:
      - key: a
        rate_limit: {unit: second, requests_per_unit: 2}
`,
		want: `q.yaml:10: domain "q": a quota bucket with the keys ["a", "b"] selects both this descriptor (keys in the order ["b", "a"]) and the one at q.yaml:6 (in the order ["a", "b"]); an RLQS bucket has no key order, so one of them must go or their values must not overlap`,
	}, {
		// Exact values that differ keep the two orders apart.
		doc: `
domain: q
descriptors:
  - key: a
    value: x
    descriptors:
      - key: b
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: b
    descriptors:
      - key: a
        value: y
        rate_limit: {unit: second, requests_per_unit: 2}
`,
	}, {
		// The exact value x is taken by the exact node at b's level, so the
		// key-only a below b never sees it; but any other value does.
		doc: `
domain: q
descriptors:
  - key: a
    value: x
    descriptors:
      - key: b
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: b
    descriptors:
      - key: a
        rate_limit: {unit: second, requests_per_unit: 2}
`,
		want: `q.yaml:11: domain "q": a quota bucket with the keys ["a", "b"] selects both this descriptor (keys in the order ["b", "a"]) and the one at q.yaml:7`,
	}, {
		// Overlapping wildcards.
		doc: `
domain: q
descriptors:
  - key: a
    value: "x*"
    descriptors:
      - key: b
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: b
    descriptors:
      - key: a
        value: "*y"
        rate_limit: {unit: second, requests_per_unit: 2}
`,
		want: `q.yaml:11: domain "q": a quota bucket with the keys ["a", "b"] selects both this descriptor (keys in the order ["b", "a"]) and the one at q.yaml:7`,
	}, {
		// Disjoint wildcards (prefixes that differ).
		doc: `
domain: q
descriptors:
  - key: a
    value: "x*"
    descriptors:
      - key: b
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: b
    descriptors:
      - key: a
        value: "y*"
        rate_limit: {unit: second, requests_per_unit: 2}
`,
	}, {
		// A wildcard shadowed by an earlier node at its level (which leads
		// nowhere) never selects: the bucket has one way, a, b, c.
		doc: `
domain: q
descriptors:
  - key: b
    descriptors:
      - key: a
        value: "*"
      - key: a
        value: "x*"
        descriptors:
          - key: c
            rate_limit: {unit: second, requests_per_unit: 2}
  - key: a
    descriptors:
      - key: b
        descriptors:
          - key: c
            rate_limit: {unit: second, requests_per_unit: 1}
`,
	}, {
		// Neither path has a limit: both just allow.
		doc: `
domain: q
descriptors:
  - key: a
    descriptors:
      - key: b
  - key: b
    descriptors:
      - key: a
`,
	}, {
		// Three keys, one order differing at the second level.
		doc: `
domain: q
descriptors:
  - key: a
    descriptors:
      - key: b
        descriptors:
          - key: c
            rate_limit: {unit: second, requests_per_unit: 1}
      - key: c
        descriptors:
          - key: b
            rate_limit: {unit: second, requests_per_unit: 1}
`,
		want: `q.yaml:12: domain "q": a quota bucket with the keys ["a", "b", "c"]`,
	}} {
		_, err := parseOrderFree(tc.doc)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("case %d: refused: %v", i, err)
		case tc.want != "" && (err == nil || !strings.HasPrefix(err.Error(), tc.want)):
			t.Errorf("case %d: got %v, want %s...", i, err, tc.want)
		}
		// Without OrderFree every one of them loads (RLS requests have an
		// order).
		if _, err := Parse("q.yaml", []byte(tc.doc)); err != nil {
			t.Errorf("case %d: refused without OrderFree: %v", i, err)
		}
	}
}

// TestOrderFreeLargeConfig: many exact values under one order and one
// descriptor under the other are checked without comparing every pair.
func TestOrderFreeLargeConfig(t *testing.T) {
	var b strings.Builder
	b.WriteString("domain: q\ndescriptors:\n  - key: user\n    descriptors:\n")
	for i := range 20000 {
		fmt.Fprintf(&b, "      - key: path\n        value: /p%d\n        rate_limit: {unit: second, requests_per_unit: 1}\n", i)
	}
	b.WriteString("  - key: path\n    value: /other\n    descriptors:\n      - key: user\n        rate_limit: {unit: second, requests_per_unit: 1}\n")
	if _, err := parseOrderFree(b.String()); err != nil {
		t.Fatal(err)
	}
	b.WriteString("  - key: path\n    value: /p7\n    descriptors:\n      - key: user\n        rate_limit: {unit: second, requests_per_unit: 1}\n")
	_, err := parseOrderFree(b.String())
	if err == nil || !strings.Contains(err.Error(), `selects both`) || strings.Count(err.Error(), "\n") != 0 {
		t.Fatalf("got %v, want one error", err)
	}
}
