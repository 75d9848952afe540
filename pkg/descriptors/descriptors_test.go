package descriptors

import (
	"fmt"
	"strings"
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

type matchCase struct {
	request []string
	want    string // describePath of the expected result
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
