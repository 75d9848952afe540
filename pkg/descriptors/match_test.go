package descriptors

import (
	"fmt"
	"strings"
	"sync"
	"testing"
)

// describePath renders a match result: "key=value@line/..." or "nil".
func describePath(path []*Node) string {
	if path == nil {
		return "nil"
	}
	parts := make([]string, len(path))
	for i, n := range path {
		parts[i] = fmt.Sprintf("%s=%s@%d", n.Key, n.Value, n.Line)
	}
	return strings.Join(parts, "/")
}

func runMatches(t *testing.T, d *Domain, cases []matchCase) {
	t.Helper()
	for i, c := range cases {
		got := describePath(d.Match(entries(c.request...), nil))
		if got != c.want {
			t.Errorf("case %d %v: got %s, want %s", i, c.request, got, c.want)
		}
	}
}

func TestMatchPrecedence(t *testing.T) {
	d := mustDomain(t, mustParse(t, `
domain: p
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: k
    value: "v*"
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: k
    value: v1
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: k
    value: "va*"
    rate_limit: {unit: second, requests_per_unit: 4}
  - key: all
    value: "*"
  - key: all
    value: exact
  - key: all
`), "p")
	runMatches(t, d, []matchCase{
		{[]string{"k=v1"}, "k=v1@9"}, // exact beats wildcard and default
		{[]string{"k=v2"}, "k=v*@6"}, // wildcard beats default
		{[]string{"k=va"}, "k=v*@6"}, // first wildcard in config order wins
		{[]string{"k=x"}, "k=@4"},    // default
		{[]string{"k="}, "k=@4"},     // an empty value is just a value
		{[]string{"all=exact"}, "all=exact@17"},
		{[]string{"all=other"}, "all=*@15"}, // a bare * shadows the default
		{[]string{"all="}, "all=*@15"},      // * matches the empty value
		{[]string{"missing=v1"}, "nil"},
		{nil, "nil"},
	})
}

func TestMatchWildcards(t *testing.T) {
	d := mustDomain(t, mustParse(t, `
domain: w
descriptors:
  - {key: prefix, value: "api/*"}
  - {key: suffix, value: "*.png"}
  - {key: inner, value: "a*b*c"}
  - {key: multi, value: "*x*y*"}
  - {key: doubled, value: "ab**ba"}
  - {key: overlap, value: "ab*ba"}
`), "w")
	cases := []struct {
		key, value string
		match      bool
	}{
		{"prefix", "api/", true},
		{"prefix", "api/v1/users", true},
		{"prefix", "ap", false},
		{"prefix", "xapi/", false},
		{"suffix", ".png", true},
		{"suffix", "logo.png", true},
		{"suffix", "logo.png.gz", false},
		{"inner", "abc", true},
		{"inner", "a-b-c", true},
		{"inner", "aXbYbZc", true},
		{"inner", "acb", false},
		{"inner", "ab", false},
		{"inner", "abcx", false},
		{"multi", "xy", true},
		{"multi", "1x2y3", true},
		{"multi", "yx", false},
		{"doubled", "abba", true},
		{"doubled", "ab--ba", true},
		{"overlap", "aba", false}, // prefix and suffix may not share bytes
		{"overlap", "abba", true},
	}
	for _, c := range cases {
		path := d.Match([]Entry{{c.key, c.value}}, nil)
		if (path != nil) != c.match {
			t.Errorf("%s=%q: matched %v, want %v", c.key, c.value, path != nil, c.match)
		}
		if path != nil && !path[0].Wildcard {
			t.Errorf("%s=%q: node is not a wildcard", c.key, c.value)
		}
	}
}

func TestMatchDepth(t *testing.T) {
	d := mustDomain(t, mustLoad(t, "testdata/reference/depth.yaml"), "depth")
	runMatches(t, d, []matchCase{
		{[]string{"tenant=acme"}, "tenant=acme@3"},
		// More entries than the tree is deep: the depth-1 limit does not apply.
		{[]string{"tenant=acme", "user=u1"}, "nil"},
		{[]string{"tenant=globex", "user=u1"}, "tenant=globex@8/user=@11"},
		// Fewer entries: the node matches but holds no limit.
		{[]string{"tenant=globex"}, "tenant=globex@8"},
		{[]string{"tenant=globex", "user=u1", "extra=1"}, "nil"},
		{[]string{"user=u1"}, "nil"},
	})
	if p := d.Match(entries("tenant=acme"), nil); len(p[0].Limits) != 1 {
		t.Errorf("tenant=acme has %d limits, want 1", len(p[0].Limits))
	}
	if p := d.Match(entries("tenant=globex"), nil); len(p[0].Limits) != 0 {
		t.Errorf("tenant=globex has %d limits, want 0", len(p[0].Limits))
	}
}

func TestMatchNoBacktracking(t *testing.T) {
	// The exact node is chosen even though only the default node leads
	// further, as in the reference server.
	d := mustDomain(t, mustParse(t, `
domain: b
descriptors:
  - key: a
    value: x
  - key: a
    descriptors:
      - key: b
        rate_limit: {unit: second, requests_per_unit: 1}
`), "b")
	runMatches(t, d, []matchCase{
		{[]string{"a=x", "b=1"}, "nil"},
		{[]string{"a=y", "b=1"}, "a=@6/b=@8"},
		{[]string{"a=x"}, "a=x@4"}, // whitelist: matched, no limit
	})
}

func TestMatchKeysAreUnambiguous(t *testing.T) {
	// The reference server joins key and value with "_" for its lookups, so
	// a key-only "a_b" there also matches the request (a, b).
	d := mustDomain(t, mustParse(t, `
domain: u
descriptors:
  - key: a_b
  - key: a
    value: b_c
`), "u")
	runMatches(t, d, []matchCase{
		{[]string{"a=b"}, "nil"},
		{[]string{"a_b=c"}, "a_b=@4"},
		{[]string{"a_b=anything"}, "a_b=@4"},
		{[]string{"a=b_c"}, "a=b_c@5"},
		{[]string{"a_b_c="}, "nil"},
	})
}

func TestMatchAppendsToPath(t *testing.T) {
	d := mustDomain(t, mustLoad(t, "testdata/reference/nested.yaml"), "notifications")
	buf := make([]*Node, 0, 4)
	path := d.Match(entries("kind=promo", "phone=555"), buf)
	if len(path) != 2 || &path[0] != &buf[:1][0] {
		t.Fatalf("Match did not fill the given buffer: %s", describePath(path))
	}
	var nilDomain *Domain
	if nilDomain.Match(entries("kind=promo"), nil) != nil {
		t.Error("a nil Domain matched")
	}
	if (&Config{}).Domain("x") != nil || (*Config)(nil).Domain("x") != nil {
		t.Error("an empty Config has a domain")
	}
}

func TestMatchConcurrent(t *testing.T) {
	d := mustDomain(t, mustLoad(t, "testdata/reference/features.yaml"), "features")
	reqs := [][]Entry{
		entries("service=s", "client=canary"),
		entries("path=/static/app.js"),
		entries("endpoint=users"),
		entries("nothing=here"),
	}
	want := make([]string, len(reqs))
	for i, r := range reqs {
		want[i] = describePath(d.Match(r, nil))
	}
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]*Node, 0, 4)
			for i := 0; i < 500; i++ {
				j := i % len(reqs)
				if got := describePath(d.Match(reqs[j], buf[:0])); got != want[j] {
					t.Errorf("request %d: got %s, want %s", j, got, want[j])
					return
				}
			}
		}()
	}
	wg.Wait()
}
