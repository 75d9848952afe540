package descriptors

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/envoyrls/envoy-rls/pkg/algorithms"
)

func mustParse(t testing.TB, doc string) *Config {
	t.Helper()
	c, err := Parse("test.yaml", []byte(doc))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return c
}

func mustLoad(t testing.TB, path string) *Config {
	t.Helper()
	c, err := Load(path)
	if err != nil {
		t.Fatalf("Load(%s): %v", path, err)
	}
	return c
}

func mustDomain(t testing.TB, c *Config, name string) *Domain {
	t.Helper()
	d := c.Domain(name)
	if d == nil {
		t.Fatalf("no domain %q (have %v)", name, c.Domains())
	}
	return d
}

// entries builds a request descriptor from "key=value" strings.
func entries(kvs ...string) []Entry {
	es := make([]Entry, len(kvs))
	for i, kv := range kvs {
		k, v, _ := strings.Cut(kv, "=")
		es[i] = Entry{k, v}
	}
	return es
}

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

type matchCase struct {
	request []string
	want    string // describePath of the expected result
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

// TestReferenceConfigs loads configurations in the style of the reference
// server's README, which use no extension, and matches as it does.
func TestReferenceConfigs(t *testing.T) {
	c := mustLoad(t, "testdata/reference")
	if got, want := strings.Join(c.Domains(), ","), "db_ops,depth,edge_per_ip,features,notifications"; got != want {
		t.Fatalf("domains %s, want %s", got, want)
	}

	db := mustDomain(t, c, "db_ops")
	runMatches(t, db, []matchCase{
		{[]string{"database=orders"}, "database=orders@5"},
		{[]string{"database=default"}, "database=default@10"},
		{[]string{"database=other"}, "nil"},
	})
	l := db.Match(entries("database=default"), nil)[0].Limits[0]
	if l.Unit != "SECOND" || l.RequestsPerUnit != 300 || l.Limit != (algorithms.Limit{Algorithm: algorithms.FixedWindow, Requests: 300, Window: time.Second}) {
		t.Errorf("unit SECOND limit compiled to %+v", l)
	}

	n := mustDomain(t, c, "notifications")
	runMatches(t, n, []matchCase{
		{[]string{"kind=promo", "phone=555"}, "kind=promo@4/phone=@7"},
		{[]string{"phone=555"}, "phone=@12"},
		{[]string{"kind=promo"}, "kind=promo@4"},
		{[]string{"kind=other", "phone=555"}, "nil"},
	})

	ip := mustDomain(t, c, "edge_per_ip")
	if l := ip.Match(entries("remote_address=10.9.8.7"), nil)[0].Limits[0]; l.RequestsPerUnit != 0 || l.Limit.Requests != 0 {
		t.Errorf("blocked address limit %+v, want 0 requests", l)
	}
	if l := ip.Match(entries("remote_address=10.0.0.1"), nil)[0].Limits[0]; l.RequestsPerUnit != 20 {
		t.Errorf("default address limit %+v, want 20", l)
	}

	f := mustDomain(t, c, "features")
	node := func(kvs ...string) *Node {
		t.Helper()
		p := f.Match(entries(kvs...), nil)
		if p == nil {
			t.Fatalf("%v matched nothing", kvs)
		}
		return p[len(p)-1]
	}
	if l := node("internal=x").Limits[0]; !l.Unlimited || l.ID != "unlimited" {
		t.Errorf("unlimited limit %+v", l)
	}
	if l := node("service=s", "client=canary").Limits[0]; !l.Shadow {
		t.Error("shadow_mode of the node did not reach its limit")
	}
	if l := node("service=s", "client=stable").Limits[0]; l.Shadow {
		t.Error("stable client limit is shadowed")
	}
	if l := node("region=eu", "account=a42").Limits[0]; l.Name != "account_a42" {
		t.Errorf("name %q", l.Name)
	}
	if l := node("region=us", "account=a42").Limits[0]; fmt.Sprint(l.Replaces) != "[account_a42]" {
		t.Errorf("replaces %v", l.Replaces)
	}
	if n := node("endpoint=health"); len(n.Limits) != 0 {
		t.Error("whitelisted endpoint has limits")
	}
	if n := node("path=/static/img/logo.png"); n.Value != "/static/*" || len(n.Limits) != 1 {
		t.Errorf("wildcard path matched %s", n.Value)
	}
	if n := node("tenant=t1"); !n.QuotaMode || !n.ValueToMetric || n.Limits[0].Unit != "WEEK" || n.Limits[0].Limit.Window != 7*24*time.Hour {
		t.Errorf("tenant node %+v", n)
	}
	if n := node("flag=yes"); n.Value != "yes" {
		t.Errorf("value: yes read as %q", n.Value)
	}
	if n := node("number=123"); n.Value != "123" {
		t.Errorf("value: 123 read as %q", n.Value)
	}
}

func TestCounterValue(t *testing.T) {
	f := mustDomain(t, mustLoad(t, "testdata/reference/features.yaml"), "features")
	shared := f.Match(entries("bucket=media-1"), nil)[0]
	if got := shared.CounterValue("media-1"); got != "media-*" {
		t.Errorf("share_threshold counter value %q, want the pattern", got)
	}
	own := f.Match(entries("path=/static/a"), nil)[0]
	if got := own.CounterValue("/static/a"); got != "/static/a" {
		t.Errorf("wildcard counter value %q, want the request value", got)
	}
}

func TestStatsKey(t *testing.T) {
	c := mustParse(t, `
domain: s
descriptors:
  - key: plain
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: plain
    value: v
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: wild
    value: "w*"
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: detailed
    detailed_metric: true
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: parent
    descriptors:
      - key: child
        detailed_metric: true
        rate_limit: {unit: second, requests_per_unit: 1}
      - key: vtm
        value_to_metric: true
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: vtm
    value_to_metric: true
    descriptors:
      - key: leaf
        value: "l*"
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: shared
    value: "s*"
    share_threshold: true
    value_to_metric: true
    descriptors:
      - key: leaf
        detailed_metric: true
        rate_limit: {unit: second, requests_per_unit: 1}
`)
	d := mustDomain(t, c, "s")
	cases := []struct {
		request []string
		want    string
	}{
		{[]string{"plain=x"}, "s.plain"},
		{[]string{"plain=v"}, "s.plain_v"},
		{[]string{"wild=w1"}, "s.wild_w*"},
		{[]string{"detailed=x"}, "s.detailed_x"},
		{[]string{"detailed="}, "s.detailed"},
		{[]string{"parent=p", "child=c"}, "s.parent_p.child_c"},
		{[]string{"parent=p", "vtm=v"}, "s.parent.vtm_v"},
		{[]string{"vtm=v", "leaf=l1"}, "s.vtm_v.leaf_l*"},
		{[]string{"shared=s1", "leaf=x"}, "s.shared_s*.leaf_x"},
	}
	for _, c := range cases {
		es := entries(c.request...)
		p := d.Match(es, nil)
		if p == nil {
			t.Fatalf("%v matched nothing", c.request)
		}
		if got := p[len(p)-1].StatsKey(es); got != c.want {
			t.Errorf("%v: stats key %q, want %q", c.request, got, c.want)
		}
	}
}

func TestMetadata(t *testing.T) {
	f := mustDomain(t, mustLoad(t, "testdata/reference/features.yaml"), "features")
	md := f.Match(entries("tenant=t"), nil)[0].Metadata
	if md == nil {
		t.Fatal("no metadata")
	}
	got := md.AsMap()
	want := map[string]any{
		"owner":   "billing",
		"weight":  2.0,
		"tags":    []any{"a", "b"},
		"enabled": true,
		"extra":   nil,
		"nested":  map[string]any{"level": 1.0},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("metadata %v, want %v", got, want)
	}
	if f.Match(entries("partner=p"), nil)[0].Metadata != nil {
		t.Error("node without metadata has some")
	}
}

func TestExtensions(t *testing.T) {
	c := mustParse(t, `
domain: ext
default_algorithm: token_bucket
tiers:
  free:
    - name: free_min
      unit: minute
      requests_per_unit: 10
      algorithm: sliding_window_counter
    - unit: second
      requests_per_unit: 2
      burst: 4
  unused:
    - {unit: day, requests_per_unit: 1}
descriptors:
  - key: plan
    value: free
    descriptors:
      - key: user
        tier: free
  - key: shadowed
    shadow_mode: true
    tier: free
  - key: api
    rate_limits:
      - unit: minute
        requests_per_unit: 100
        algorithm: fixed_window
      - window: 1h30m
        requests_per_unit: 20
        algorithm: gcra
        burst: 5
        shadow_mode: true
      - window: 250ms
        requests_per_unit: 3
        algorithm: sliding_window_log
`)
	d := mustDomain(t, c, "ext")
	if d.DefaultAlgorithm != algorithms.TokenBucket {
		t.Errorf("default algorithm %v", d.DefaultAlgorithm)
	}
	type lim struct {
		name, unit string
		limit      algorithms.Limit
		shadow     bool
	}
	check := func(request []string, want []lim) {
		t.Helper()
		p := d.Match(entries(request...), nil)
		if p == nil {
			t.Fatalf("%v matched nothing", request)
		}
		ls := p[len(p)-1].Limits
		if len(ls) != len(want) {
			t.Fatalf("%v: %d limits, want %d", request, len(ls), len(want))
		}
		for i, w := range want {
			got := lim{ls[i].Name, ls[i].Unit, ls[i].Limit, ls[i].Shadow}
			if got != w {
				t.Errorf("%v limit %d: %+v, want %+v", request, i, got, w)
			}
			if ls[i].RequestsPerUnit != uint32(w.limit.Requests) {
				t.Errorf("%v limit %d: RequestsPerUnit %d", request, i, ls[i].RequestsPerUnit)
			}
			if err := ls[i].Limit.Validate(); err != nil {
				t.Errorf("%v limit %d: %v", request, i, err)
			}
		}
	}
	free := []lim{
		{"free_min", "MINUTE", algorithms.Limit{Algorithm: algorithms.SlidingWindowCounter, Requests: 10, Window: time.Minute}, false},
		{"", "SECOND", algorithms.Limit{Algorithm: algorithms.TokenBucket, Requests: 2, Window: time.Second, Burst: 4}, false},
	}
	check([]string{"plan=free", "user=u"}, free)
	shadowed := []lim{free[0], free[1]}
	shadowed[0].shadow, shadowed[1].shadow = true, true
	check([]string{"shadowed=x"}, shadowed)
	check([]string{"plan=free", "user=u"}, free) // the tier itself is unchanged
	check([]string{"api=k"}, []lim{
		{"", "MINUTE", algorithms.Limit{Algorithm: algorithms.FixedWindow, Requests: 100, Window: time.Minute}, false},
		{"", "", algorithms.Limit{Algorithm: algorithms.GCRA, Requests: 20, Window: 90 * time.Minute, Burst: 5}, true},
		{"", "", algorithms.Limit{Algorithm: algorithms.SlidingWindowLog, Requests: 3, Window: 250 * time.Millisecond}, false},
	})
}

func TestLimitIDs(t *testing.T) {
	const doc = `
domain: ids
descriptors:
  - key: a
    rate_limit: {name: first, unit: minute, requests_per_unit: 10}
  - key: b
    rate_limits:
      - {unit: minute, requests_per_unit: 10, algorithm: token_bucket}
      - {window: 60s, requests_per_unit: 10}
`
	// The same limits renamed and in another order.
	const moved = `
domain: ids
descriptors:
  - key: b
    rate_limits:
      - {window: 1m, requests_per_unit: 10, name: renamed}
      - {unit: MINUTE, requests_per_unit: 10, algorithm: token_bucket, shadow_mode: true}
  - key: a
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 10}
`
	ids := func(doc string) map[string]string {
		d := mustDomain(t, mustParse(t, doc), "ids")
		out := map[string]string{}
		for _, k := range []string{"a", "b"} {
			for _, l := range d.Match([]Entry{{k, "x"}}, nil)[0].Limits {
				out[l.Limit.Algorithm.String()+"/"+k] = l.ID
			}
		}
		return out
	}
	first, again, other := ids(doc), ids(doc), ids(moved)
	if fmt.Sprint(first) != fmt.Sprint(again) || fmt.Sprint(first) != fmt.Sprint(other) {
		t.Errorf("IDs changed across reloads:\n%v\n%v\n%v", first, again, other)
	}
	if first["fixed_window/a"] != first["fixed_window/b"] {
		t.Errorf("unit minute and window 60s have different IDs: %v", first)
	}
	if first["fixed_window/a"] == first["token_bucket/b"] {
		t.Errorf("different algorithms share an ID: %v", first)
	}

	// IDs are equal exactly when algorithm, window and position are: the
	// count (requests, burst) is not part of them.
	type ident struct {
		alg algorithms.Kind
		w   time.Duration
		n   int
	}
	seen := map[string]ident{}
	for _, alg := range algorithms.Kinds() {
		for _, w := range []time.Duration{time.Millisecond, time.Second, 10 * time.Second, time.Minute, 90 * time.Minute} {
			for n := 0; n < 12; n++ {
				id := CounterID(algorithms.Limit{Algorithm: alg, Requests: 10, Window: w}, n)
				for _, req := range []uint64{0, 1, 11, 110} {
					for _, burst := range []uint64{0, 1, 110} {
						if o := CounterID(algorithms.Limit{Algorithm: alg, Requests: req, Window: w, Burst: burst}, n); o != id {
							t.Fatalf("count changes the ID: %q vs %q", o, id)
						}
					}
				}
				if prev, ok := seen[id]; ok {
					t.Fatalf("%v and %v share ID %q", prev, ident{alg, w, n}, id)
				}
				seen[id] = ident{alg, w, n}
			}
		}
	}

	// A reload that changes counts keeps the IDs; two limits of one
	// descriptor with the same algorithm and window count apart.
	const recounted = `
domain: ids
descriptors:
  - key: a
    rate_limit: {name: first, unit: minute, requests_per_unit: 3}
  - key: b
    rate_limits:
      - {unit: minute, requests_per_unit: 99, algorithm: token_bucket, burst: 7}
      - {window: 60s, requests_per_unit: 1}
`
	if got := ids(recounted); fmt.Sprint(got) != fmt.Sprint(first) {
		t.Errorf("IDs changed with the counts:\n%v\n%v", first, got)
	}
	const twins = `
domain: ids
descriptors:
  - key: a
    rate_limits:
      - {unit: minute, requests_per_unit: 100}
      - {unit: minute, requests_per_unit: 10}
      - {unit: second, requests_per_unit: 10}
`
	ls := mustDomain(t, mustParse(t, twins), "ids").Match([]Entry{{"a", "x"}}, nil)[0].Limits
	if ls[0].ID == ls[1].ID || ls[0].ID == ls[2].ID || ls[1].ID == ls[2].ID {
		t.Errorf("limits of one descriptor share a counter: %q %q %q", ls[0].ID, ls[1].ID, ls[2].ID)
	}
}

func TestLookupUnit(t *testing.T) {
	day := 24 * time.Hour
	cases := []struct {
		unit string
		want time.Duration
		ok   bool
	}{
		{"second", time.Second, true},
		{"SECOND", time.Second, true},
		{"Minute", time.Minute, true},
		{"hour", time.Hour, true},
		{"day", day, true},
		{"week", 7 * day, true},
		{"month", 30 * day, true},
		{"year", 365 * day, true},
		{"unknown", 0, false},
		{"", 0, false},
		{"seconds", 0, false},
	}
	for _, c := range cases {
		_, got, ok := lookupUnit(c.unit)
		if got != c.want || ok != c.ok {
			t.Errorf("lookupUnit(%q) = %v, %v; want %v, %v", c.unit, got, ok, c.want, c.ok)
		}
	}
}

func TestLoadDirectory(t *testing.T) {
	// dir holds two configs, plus a dotfile, a .txt file and a
	// subdirectory with invalid YAML that must all be skipped.
	c := mustLoad(t, "testdata/dir")
	if got := strings.Join(c.Domains(), ","); got != "alpha,beta" {
		t.Errorf("domains %s, want alpha,beta", got)
	}
	if d := mustDomain(t, c, "alpha"); d.File != filepath.Join("testdata/dir", "a.yaml") || d.Line != 1 {
		t.Errorf("alpha defined at %s:%d", d.File, d.Line)
	}
}

func TestLoadDuplicateDomain(t *testing.T) {
	_, err := Load("testdata/dupdomain")
	equalLines(t, errorLines(t, err), []string{
		`testdata/dupdomain/three.yaml:4: invalid unit "lightyear" (want second, minute, hour, day, week, month or year)`,
		`testdata/dupdomain/two.yaml:2: duplicate domain "shared" (also defined at testdata/dupdomain/one.yaml:1)`,
	})
}

func TestLoadReportsManyErrors(t *testing.T) {
	_, err := Load("testdata/errors/many.yaml")
	var errs Errors
	if !errors.As(err, &errs) {
		t.Fatalf("error %v is not an Errors", err)
	}
	want := wantErrors(t, "testdata/errors/many.yaml")
	if len(errs) != len(want) || len(errs) < 10 {
		t.Fatalf("got %d errors, want all %d:\n%v", len(errs), len(want), err)
	}
	for i := 1; i < len(errs); i++ {
		if errs[i].Line < errs[i-1].Line {
			t.Errorf("errors not in line order: %v before %v", errs[i-1], errs[i])
		}
	}
}

func TestLoadFailures(t *testing.T) {
	_, err := Load("testdata/no-such-file.yaml")
	equalLines(t, errorLines(t, err), []string{"testdata/no-such-file.yaml: cannot read: no such file or directory"})

	empty := t.TempDir()
	if err := os.WriteFile(filepath.Join(empty, "README"), []byte("not a config"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = Load(empty)
	equalLines(t, errorLines(t, err), []string{empty + ": no *.yaml or *.yml files in directory"})
}

func TestLoadFollowsSymlinks(t *testing.T) {
	dir := t.TempDir()
	target, err := filepath.Abs("testdata/dir/a.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, filepath.Join(dir, "linked.yaml")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(t.TempDir(), filepath.Join(dir, "subdir.yaml")); err != nil {
		t.Fatal(err)
	}
	c := mustLoad(t, dir)
	if got := strings.Join(c.Domains(), ","); got != "alpha" {
		t.Errorf("domains %s, want alpha", got)
	}
}

func TestEmptyValueIsNoValue(t *testing.T) {
	_, err := Parse("e.yaml", []byte(`
domain: e
descriptors:
  - key: a
  - key: a
    value: ""
`))
	equalLines(t, errorLines(t, err), []string{`e.yaml:5: duplicate descriptor with key "a" and no value (first at line 4)`})
}

func TestAliases(t *testing.T) {
	d := mustDomain(t, mustParse(t, `
domain: al
descriptors:
  - key: a
    rate_limit: &lim {unit: second, requests_per_unit: 7}
  - key: b
    rate_limit: *lim
`), "al")
	if l := d.Match(entries("b=x"), nil)[0].Limits[0]; l.RequestsPerUnit != 7 {
		t.Errorf("aliased limit %+v", l)
	}
}

// TestExampleConfig loads the descriptor configuration shipped in
// examples/.
func TestExampleConfig(t *testing.T) {
	c := mustLoad(t, "../../examples/ratelimit.yaml")
	if len(c.Domains()) != 1 {
		t.Errorf("domains %v", c.Domains())
	}
}

func TestParseDocuments(t *testing.T) {
	c, err := ParseDocuments([]Document{
		{File: "a", Data: []byte("domain: ns/a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n")},
		{File: "b", Data: []byte("domain: b\n")},
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Domains(); len(got) != 2 || got[0] != "b" || got[1] != "ns/a" {
		t.Fatalf("domains = %v", got)
	}
	_, err = ParseDocuments([]Document{{File: "a", Data: []byte("domain: d\n")}, {File: "b", Data: []byte("domain: d\n")}})
	if err == nil || !strings.Contains(err.Error(), `b:1: duplicate domain "d" (also defined at a:1)`) {
		t.Fatalf("duplicate domain: %v", err)
	}
	if c, err := ParseDocuments(nil); err != nil || len(c.Domains()) != 0 {
		t.Fatalf("no documents: %v, %v", c, err)
	}
}

// Envoy Gateway dumps the configs it serves as YAML with the resource's
// name at the top, every field spelled out (null limits on inner levels,
// empty replaces, false flags). Such a file loads.
func TestEnvoyGatewayDumpLoads(t *testing.T) {
	const dump = `name: default/eg/http
domain: default/eg/http
descriptors:
  - key: httproute/default/backend/rule/0
    value: httproute/default/backend/rule/0
    rate_limit: null
    descriptors:
      - key: rule-0-match-0
        value: ""
        rate_limit: null
        descriptors:
          - key: masked_remote_address
            value: 0.0.0.0/0
            rate_limit:
              requests_per_unit: 3
              unit: HOUR
              unlimited: false
              name: ""
              replaces: []
            descriptors: []
            shadow_mode: false
            quota_mode: false
            detailed_metric: false
            value_to_metric: false
            share_threshold: false
        shadow_mode: false
        quota_mode: false
        detailed_metric: false
        value_to_metric: false
        share_threshold: false
    shadow_mode: false
    quota_mode: false
    detailed_metric: false
    value_to_metric: false
    share_threshold: false
`
	c, err := Parse("eg.yaml", []byte(dump))
	if err != nil {
		t.Fatal(err)
	}
	p := c.Domain("default/eg/http").Match([]Entry{
		{"httproute/default/backend/rule/0", "httproute/default/backend/rule/0"},
		{"rule-0-match-0", "alice"},
		{"masked_remote_address", "0.0.0.0/0"},
	}, nil)
	if len(p) != 3 || len(p[2].Limits) != 1 || p[2].Limits[0].RequestsPerUnit != 3 || p[2].Limits[0].Unit != "HOUR" {
		t.Fatalf("match = %v", p)
	}
}
