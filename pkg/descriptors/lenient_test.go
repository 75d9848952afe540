package descriptors

import (
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// lenientCase is a file the reference server's checker accepts and
// envoy-rls refuses by default (one row of README's difference table).
type lenientCase struct {
	name   string
	file   string
	strict []string // the errors by default, "line: reason"
	warns  []string // the warnings with Options.Lenient, "line: reason"
	check  func(t *testing.T, c *Config)
}

// limitOf returns the one limit of the descriptor key=k of domain.
func limitOf(t *testing.T, c *Config, domain string, kvs ...string) *RateLimit {
	t.Helper()
	path := mustDomain(t, c, domain).Match(entries(kvs...), nil)
	if len(path) == 0 || len(path[len(path)-1].Limits) != 1 {
		t.Fatalf("%s %v: path %s, want one limit", domain, kvs, describePath(path))
	}
	return path[len(path)-1].Limits[0]
}

var lenientCases = []lenientCase{{
	name:   "field twice",
	file:   "domain: a\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: minute\n      requests_per_unit: 1\n      unit: hour\n",
	strict: []string{`7: duplicate field "unit" (first at line 5)`},
	warns:  []string{"7: unit given twice (lines 5 and 7): using the last, as the reference does"},
	check: func(t *testing.T, c *Config) {
		if l := limitOf(t, c, "a", "k=v"); l.Unit != "HOUR" || l.Limit.Window != time.Hour || l.RequestsPerUnit != 1 {
			t.Errorf("limit %s %v %d, want the last unit (HOUR)", l.Unit, l.Limit.Window, l.RequestsPerUnit)
		}
	},
}, {
	name:   "rate_limit twice",
	file:   "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n    rate_limit: {unit: hour}\n",
	strict: []string{`5: duplicate field "rate_limit" (first at line 4)`},
	warns: []string{
		"5: rate_limit given twice (lines 4 and 5): the two are merged, the last value of each field winning, as the reference does",
	},
	check: func(t *testing.T, c *Config) {
		if l := limitOf(t, c, "a", "k=v"); l.Unit != "HOUR" || l.RequestsPerUnit != 5 {
			t.Errorf("limit %s %d, want HOUR 5 (yaml.v2 decodes the second mapping into the first)", l.Unit, l.RequestsPerUnit)
		}
	},
}, {
	name:   "rate_limit twice, the last null",
	file:   "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n    rate_limit: ~\n",
	strict: []string{`5: duplicate field "rate_limit" (first at line 4)`},
	warns:  []string{"5: rate_limit given twice (lines 4 and 5): using the last, as the reference does"},
	check: func(t *testing.T, c *Config) {
		if path := mustDomain(t, c, "a").Match(entries("k=v"), nil); len(path) != 1 || len(path[0].Limits) != 0 {
			t.Errorf("path %s, want k without a limit", describePath(path))
		}
	},
}, {
	name:   "domain twice",
	file:   "domain: a\ndomain: b\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 2}\n",
	strict: []string{`2: duplicate field "domain" (first at line 1)`},
	warns:  []string{"2: domain given twice (lines 1 and 2): using the last, as the reference does"},
	check: func(t *testing.T, c *Config) {
		if got := strings.Join(c.Domains(), ","); got != "b" {
			t.Errorf("domains %s, want b (the last)", got)
		}
		if l := limitOf(t, c, "b", "k=v"); l.RequestsPerUnit != 2 {
			t.Errorf("limit %d", l.RequestsPerUnit)
		}
	},
}, {
	name: "misplaced fields",
	file: "domain: a\nname: a\nunit: second\ndescriptors:\n  - key: k\n    requests_per_unit: 4\n" +
		"    rate_limit: {unit: minute, requests_per_unit: 1, shadow_mode: true}\n    domain: x\n",
	strict: []string{`3: unknown field "unit" in config`, `6: unknown field "requests_per_unit" in descriptor`, `8: unknown field "domain" in descriptor`},
	warns: []string{
		"3: unit is not a field of a config: ignored, as the reference does",
		"6: requests_per_unit is not a field of a descriptor: ignored, as the reference does",
		"7: shadow_mode in a rate_limit: ignored, as the reference does (the limit is enforced; put shadow_mode on the descriptor to shadow it)",
		"8: domain is not a field of a descriptor: ignored, as the reference does",
	},
	check: func(t *testing.T, c *Config) {
		if l := limitOf(t, c, "a", "k=v"); l.Unit != "MINUTE" || l.RequestsPerUnit != 1 || l.Shadow {
			t.Errorf("limit %s %d shadow=%v, want MINUTE 1 enforced", l.Unit, l.RequestsPerUnit, l.Shadow)
		}
	},
}, {
	name:   "misplaced field in a replaces entry",
	file:   "domain: a\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: minute\n      requests_per_unit: 1\n      name: n\n      replaces:\n        - name: x\n          unit: minute\n",
	strict: []string{`10: unknown field "unit" in replaces entry`},
	warns:  []string{"10: unit is not a field of a replaces entry: ignored, as the reference does"},
	check: func(t *testing.T, c *Config) {
		if l := limitOf(t, c, "a", "k=v"); len(l.Replaces) != 1 || l.Replaces[0] != "x" {
			t.Errorf("replaces %v, want [x]", l.Replaces)
		}
	},
}, {
	name:   "unlimited with a count",
	file:   "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, requests_per_unit: 5}\n",
	strict: []string{"4: unlimited must not be combined with requests_per_unit"},
	warns:  []string{"4: requests_per_unit 5 beside unlimited: true: ignored, as the reference does (the limit is unlimited)"},
	check: func(t *testing.T, c *Config) {
		if l := limitOf(t, c, "a", "k=v"); !l.Unlimited || l.RequestsPerUnit != 0 {
			t.Errorf("limit unlimited=%v %d, want unlimited", l.Unlimited, l.RequestsPerUnit)
		}
	},
}, {
	name:   "unlimited with a unit that is none",
	file:   "domain: a\ndescriptors:\n  - key: k\n    rate_limit:\n      unlimited: true\n      unit: fortnight\n",
	strict: []string{"6: unlimited must not be combined with unit"},
	warns:  []string{`6: unit "fortnight" beside unlimited: true is not a unit: ignored, as the reference does`},
	check: func(t *testing.T, c *Config) {
		if l := limitOf(t, c, "a", "k=v"); !l.Unlimited {
			t.Errorf("limit not unlimited")
		}
	},
}, {
	name:   "no requests_per_unit",
	file:   "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute}\n",
	strict: []string{"4: rate limit needs requests_per_unit"},
	warns:  []string{"4: rate limit without requests_per_unit: read as 0, which denies every request, as the reference does"},
	check: func(t *testing.T, c *Config) {
		if l := limitOf(t, c, "a", "k=v"); l.Unlimited || l.RequestsPerUnit != 0 || l.Limit.Requests != 0 || l.Limit.Window != time.Minute {
			t.Errorf("limit %+v, want 0 per minute", l)
		}
	},
}, {
	name: "invalid later document",
	file: "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n---\n" +
		"domain: b\ndescriptors:\n  - key: z\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n---\n" +
		"domain: c\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 3}\n",
	strict: []string{`9: invalid unit "fortnight" (want second, minute, hour, day, week, month or year)`},
	warns:  []string{`9: invalid unit "fortnight" (want second, minute, hour, day, week, month or year); document 2 of the file does not load, so it is skipped (the reference reads only the first document of a file)`},
	check: func(t *testing.T, c *Config) {
		if got := strings.Join(c.Domains(), ","); got != "a,c" {
			t.Errorf("domains %s, want a,c (the invalid document skipped, the valid ones loaded)", got)
		}
		if l := limitOf(t, c, "c", "k=v"); l.RequestsPerUnit != 3 {
			t.Errorf("limit %d", l.RequestsPerUnit)
		}
	},
}, {
	name:   "later document repeats a domain",
	file:   domainDoc("a", "k") + "---\n" + domainDoc("a", "z"),
	strict: []string{`6: duplicate domain "a" (also defined at FILE:1)`},
	warns:  []string{`6: duplicate domain "a" (also defined at FILE:1); document 2 of the file does not load, so it is skipped (the reference reads only the first document of a file)`},
	check: func(t *testing.T, c *Config) {
		if path := mustDomain(t, c, "a").Match(entries("z=v"), nil); path != nil {
			t.Errorf("the skipped document's descriptor matched: %s", describePath(path))
		}
	},
}, {
	name:   "YAML error in a later document",
	file:   domainDoc("a", "k") + "---\ndomain: [b\n",
	strict: []string{"6: invalid YAML: did not find expected ',' or ']'"},
	warns:  []string{"6: invalid YAML: did not find expected ',' or ']'; document 2 of the file does not load, so the rest of the file is skipped (the reference reads only the first document of a file)"},
	check: func(t *testing.T, c *Config) {
		mustDomain(t, c, "a")
	},
}, {
	name:   "metadata twice",
	file:   "domain: a\ndescriptors:\n  - key: k\n    metadata: {team: x, tier: 1}\n    metadata: {team: y}\n",
	strict: []string{`5: duplicate field "metadata" (first at line 4)`},
	warns: []string{
		"5: metadata given twice (lines 4 and 5): the two are merged, the last value of each field winning, as the reference does",
	},
	check: func(t *testing.T, c *Config) {
		path := mustDomain(t, c, "a").Match(entries("k=v"), nil)
		if f := path[0].Metadata.GetFields(); f["team"].GetStringValue() != "y" || f["tier"].GetNumberValue() != 1 {
			t.Errorf("metadata %v, want team y and tier 1", path[0].Metadata)
		}
	},
}, {
	name:   "metadata field twice",
	file:   "domain: a\ndescriptors:\n  - key: k\n    metadata:\n      team: x\n      team: y\n",
	strict: []string{`6: duplicate field "team" (first at line 5)`},
	warns:  []string{"6: metadata field team given twice (lines 5 and 6): using the last, as the reference does"},
	check: func(t *testing.T, c *Config) {
		path := mustDomain(t, c, "a").Match(entries("k=v"), nil)
		if got := path[0].Metadata.GetFields()["team"].GetStringValue(); got != "y" {
			t.Errorf("metadata team=%q, want y", got)
		}
	},
}}

// TestLenient: each file the reference's checker accepts and envoy-rls
// refuses by default is refused with file:line by default, and loaded with
// the reference's meaning and a warning naming file:line with Lenient.
func TestLenient(t *testing.T) {
	for _, c := range lenientCases {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(writeTree(t, map[string]string{"x.yaml": c.file}), "x.yaml")
			want := func(lines []string) string {
				var b []string
				for _, l := range lines {
					b = append(b, path+":"+strings.ReplaceAll(l, "FILE", path))
				}
				return strings.Join(b, "\n")
			}
			_, err := LoadWith(path, Options{})
			if err == nil || err.Error() != want(c.strict) {
				t.Errorf("strict: got\n%v\nwant\n%s", err, want(c.strict))
			}
			cfg, err := LoadWith(path, Options{Lenient: true})
			if err != nil {
				t.Fatalf("lenient: %v", err)
			}
			if got := Errors(cfg.Warnings()).Error(); got != want(c.warns) {
				t.Errorf("lenient warnings: got\n%s\nwant\n%s", got, want(c.warns))
			}
			c.check(t, cfg)
		})
	}
}

// TestLenientRefusesWhatTheReferenceRefuses: lenient accepts only what the
// reference's checker accepts.
func TestLenientRefusesWhatTheReferenceRefuses(t *testing.T) {
	for name, c := range map[string]struct{ file, err string }{
		"unknown field": {"domain: a\ncolour: red\n", `2: unknown field "colour" in config`},
		"extension at the wrong level": {"domain: a\ndescriptors:\n  - key: k\n    algorithm: gcra\n",
			`4: unknown field "algorithm" in descriptor`},
		"unknown field inside an ignored value": {"domain: a\nrate_limit: {unit: minute, colour: red}\n",
			`2: unknown field "colour" (in a value the reference ignores, which it still checks)`},
		"float inside an ignored value": {"domain: a\nrequests_per_unit: 1.5\n",
			`2: "1.5" must be a string, an integer, a boolean or null (in a value the reference ignores, which it still checks)`},
		"list of scalars inside an ignored value": {"domain: a\nreplaces: [x]\n",
			`2: a list may hold only mappings, got "x" (in a value the reference ignores, which it still checks)`},
		"unlimited with a unit": {"domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, unit: minute}\n",
			"4: unlimited must not be combined with unit"},
		"unlimited with a count that is not one": {"domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, requests_per_unit: -1}\n",
			"4: unlimited must not be combined with requests_per_unit"},
		"invalid first document": {"domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n---\n" + domainDoc("b", "k"),
			`4: invalid unit "fortnight" (want second, minute, hour, day, week, month or year)`},
		"no unit": {"domain: a\ndescriptors:\n  - key: k\n    rate_limit: {requests_per_unit: 1}\n", "4: rate limit needs a unit or a window"},
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(writeTree(t, map[string]string{"x.yaml": c.file}), "x.yaml")
			_, err := LoadWith(path, Options{Lenient: true})
			if err == nil || err.Error() != path+":"+c.err {
				t.Errorf("got %v, want %s:%s", err, path, c.err)
			}
		})
	}
}

// TestLenientAcrossFiles: a later document that repeats another file's
// domain is skipped (the reference does not read it); a first document
// that does is refused, as by the reference. With MergeDomains, a later
// document that conflicts is skipped as a whole.
func TestLenientAcrossFiles(t *testing.T) {
	root := writeTree(t, map[string]string{
		"1.yaml": domainDoc("a", "k"),
		"2.yaml": domainDoc("b", "k") + "---\n" + domainDoc("a", "z"),
	})
	c, err := LoadWith(root, Options{Lenient: true})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(c.Domains(), ","); got != "a,b" || len(c.Warnings()) != 1 ||
		!strings.Contains(c.Warnings()[0].Error(), "2.yaml:6: duplicate domain \"a\"") {
		t.Errorf("domains %s, warnings %v", got, Errors(c.Warnings()))
	}
	if _, err := LoadWith(root, Options{}); err == nil {
		t.Error("strict: loaded")
	}
	c, err = LoadWith(root, Options{Lenient: true, MergeDomains: true})
	if err != nil || len(c.Warnings()) != 0 {
		t.Fatalf("merged: %v, warnings %v", err, Errors(c.Warnings()))
	}
	if path := mustDomain(t, c, "a").Match(entries("z=v"), nil); len(path) != 1 {
		t.Errorf("merged: a later document that merges cleanly is loaded: %s", describePath(path))
	}

	root = writeTree(t, map[string]string{
		"1.yaml": domainDoc("a", "k"),
		"2.yaml": domainDoc("b", "k") + "---\ndomain: a\ndescriptors:\n  - key: y\n  - key: k\n",
	})
	c, err = LoadWith(root, Options{Lenient: true, MergeDomains: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Warnings()) != 1 || !strings.Contains(c.Warnings()[0].Error(), `2.yaml:9: domain "a": descriptor with key "k" and no value is also defined at `) {
		t.Errorf("warnings %v", Errors(c.Warnings()))
	}
	if path := mustDomain(t, c, "a").Match(entries("y=v"), nil); path != nil {
		t.Errorf("a conflicting later document was merged in part: %s", describePath(path))
	}
	root = writeTree(t, map[string]string{"1.yaml": domainDoc("a", "k"), "2.yaml": domainDoc("a", "k")})
	if _, err := LoadWith(root, Options{Lenient: true, MergeDomains: true}); err == nil {
		t.Error("a conflicting first document loaded")
	}
}

// TestStrictHasNoWarnings: the default records nothing.
func TestStrictHasNoWarnings(t *testing.T) {
	c := mustParse(t, domainDoc("a", "k"))
	if c.Warnings() != nil {
		t.Errorf("warnings %v", Errors(c.Warnings()))
	}
}

// TestMergeKeys: YAML merge keys (<<), which the reference (yaml.v2)
// reads, in both modes: a key written after the << overrides the merged
// one, the first mapping of a list wins, metadata and whole descriptors
// merge too. A key written before the << that also gives it is read as
// the reference reads it (the merged value) only when lenient.
func TestMergeKeys(t *testing.T) {
	file := "domain: a\ndescriptors:\n  - &d\n    key: k\n    metadata: &m {team: x, tier: 1}\n    rate_limit: &rl {unit: minute, requests_per_unit: 5}\n" +
		"  - key: j\n    rate_limit:\n      <<: *rl\n      unit: hour\n" +
		"  - key: l\n    rate_limit:\n      <<: [{unit: day}, *rl]\n" +
		"  - <<: *d\n    value: v\n    metadata: {<<: *m, team: y}\n"
	for _, lenient := range []bool{false, true} {
		path := filepath.Join(writeTree(t, map[string]string{"x.yaml": file}), "x.yaml")
		c, err := LoadWith(path, Options{Lenient: lenient})
		if err != nil {
			t.Fatalf("lenient=%v: %v", lenient, err)
		}
		if len(c.Warnings()) != 0 {
			t.Errorf("lenient=%v: warnings %v", lenient, Errors(c.Warnings()))
		}
		for kv, want := range map[string]string{"k=x": "MINUTE 5", "j=x": "HOUR 5", "l=x": "DAY 5", "k=v": "MINUTE 5"} {
			if l := limitOf(t, c, "a", kv); l.Unit+" "+strconv.Itoa(int(l.RequestsPerUnit)) != want {
				t.Errorf("lenient=%v: %s: %s %d, want %s", lenient, kv, l.Unit, l.RequestsPerUnit, want)
			}
		}
		path2 := mustDomain(t, c, "a").Match(entries("k=v"), nil)
		if f := path2[0].Metadata.GetFields(); f["team"].GetStringValue() != "y" || f["tier"].GetNumberValue() != 1 {
			t.Errorf("lenient=%v: merged metadata %v", lenient, path2[0].Metadata)
		}
	}

	before := "domain: a\ndescriptors:\n  - key: k\n    rate_limit: &rl {unit: minute, requests_per_unit: 5}\n" +
		"  - key: j\n    rate_limit:\n      unit: hour\n      <<: *rl\n"
	path := filepath.Join(writeTree(t, map[string]string{"x.yaml": before}), "x.yaml")
	if _, err := LoadWith(path, Options{}); err == nil || err.Error() != path+":7: unit is written before the << of line 8 that also gives it: YAML takes this one, the reference server the merged one (put << first)" {
		t.Errorf("strict, a key before <<: %v", err)
	}
	c, err := LoadWith(path, Options{Lenient: true})
	if err != nil {
		t.Fatal(err)
	}
	if got := Errors(c.Warnings()).Error(); got != path+":7: unit is written before the << of line 8 that also gives it: using the merged value, as the reference does" {
		t.Errorf("lenient warnings %s", got)
	}
	if l := limitOf(t, c, "a", "j=x"); l.Unit != "MINUTE" {
		t.Errorf("lenient, a key before <<: %s, want the merged MINUTE", l.Unit)
	}

	// A rate_limit overriding the one a << gives: YAML replaces it, the
	// reference merges the two.
	over := "domain: a\ndescriptors:\n  - &d\n    key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n" +
		"  - <<: *d\n    value: v\n    rate_limit: {unit: hour}\n"
	path = filepath.Join(writeTree(t, map[string]string{"x.yaml": over}), "x.yaml")
	if _, err := LoadWith(path, Options{}); err == nil || err.Error() != path+":8: rate_limit overrides the one of line 5, which has requests_per_unit: YAML drops it, the reference server merges the two mappings (give every field in one)" {
		t.Errorf("strict, rate_limit over a merged one: %v", err)
	}
	if c, err = LoadWith(path, Options{Lenient: true}); err != nil {
		t.Fatal(err)
	}
	if got := Errors(c.Warnings()).Error(); got != path+":8: rate_limit overrides the one of line 5, which has requests_per_unit: the two are merged, the last value of each field winning, as the reference does" {
		t.Errorf("lenient warnings %s", got)
	}
	if l := limitOf(t, c, "a", "k=v"); l.Unit != "HOUR" || l.RequestsPerUnit != 5 {
		t.Errorf("lenient, rate_limit over a merged one: %s %d, want HOUR 5", l.Unit, l.RequestsPerUnit)
	}

	bad := filepath.Join(writeTree(t, map[string]string{"x.yaml": "domain: a\n<<: 5\n"}), "x.yaml")
	if _, err := LoadWith(bad, Options{Lenient: true}); err == nil || err.Error() != bad+`:2: << must name a mapping or a list of mappings, got "5"` {
		t.Errorf("<< of a scalar: %v", err)
	}
}
