package descriptors

import "testing"

// TestUsageAccountingResolves: a descriptor's usage_accounting applies to
// it and to the descriptors nested in it, unless they set their own; the
// file's default_usage_accounting applies where none is set, and UsageUnset
// is left where the file has none either (the service's default decides).
func TestUsageAccountingResolves(t *testing.T) {
	c := mustParse(t, `
domain: a
default_usage_accounting: never
descriptors:
  - key: plain
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: parent
    usage_accounting: always
    descriptors:
      - key: child
        rate_limit: {unit: hour, requests_per_unit: 1}
      - key: own
        usage_accounting: auto
        rate_limit: {unit: hour, requests_per_unit: 1}
  - key: quota
    quota_mode: true
    usage_accounting: always
    rate_limit: {unit: hour, requests_per_unit: 1}
---
domain: b
descriptors:
  - key: plain
    rate_limit: {unit: hour, requests_per_unit: 1}
`)
	for _, tc := range []struct {
		domain  string
		request []string
		want    UsageAccounting
	}{
		{"a", []string{"plain=x"}, UsageNever},
		{"a", []string{"parent=x"}, UsageAlways},
		{"a", []string{"parent=x", "child=y"}, UsageAlways},
		{"a", []string{"parent=x", "own=y"}, UsageAuto},
		{"a", []string{"quota=x"}, UsageAlways},
		{"b", []string{"plain=x"}, UsageUnset},
	} {
		p := mustDomain(t, c, tc.domain).Match(entries(tc.request...), nil)
		if got := p[len(p)-1].UsageAccounting; got != tc.want {
			t.Errorf("%s %v: %v, want %v", tc.domain, tc.request, got, tc.want)
		}
	}
	if a, b := mustDomain(t, c, "a").DefaultUsageAccounting, mustDomain(t, c, "b").DefaultUsageAccounting; a != UsageNever || b != UsageUnset {
		t.Errorf("file defaults %v and %v, want never and unset", a, b)
	}
}

func TestUsageAccountingAccounts(t *testing.T) {
	for _, tc := range []struct {
		u        UsageAccounting
		hits     uint64
		explicit bool
		want     bool
	}{
		{UsageUnset, 5, true, true},
		{UsageUnset, 5, false, false},
		{UsageAuto, 5, true, true},
		{UsageAuto, 1, false, false},
		{UsageAuto, 0, true, false},
		{UsageAlways, 1, false, true},
		{UsageAlways, 0, true, false},
		{UsageNever, 5, true, false},
	} {
		if got := tc.u.Accounts(tc.hits, tc.explicit); got != tc.want {
			t.Errorf("%q.Accounts(%d, %t) = %t", tc.u, tc.hits, tc.explicit, got)
		}
	}
	for _, name := range []string{"auto", "always", "never"} {
		var u UsageAccounting
		if err := u.UnmarshalText([]byte(name)); err != nil || u.String() != name {
			t.Errorf("%s: %v %v", name, u, err)
		}
	}
	var u UsageAccounting
	if err := u.UnmarshalText([]byte("")); err == nil {
		t.Error("empty name accepted")
	}
}

// TestConsistencyResolves: a limit's consistency is its own, else its
// file's default_consistency, else unset (the service's default decides),
// in rate_limit, composite lists and tiers alike; a sliding_window_log is
// strict whatever the default says.
func TestConsistencyResolves(t *testing.T) {
	c := mustParse(t, `
domain: a
default_consistency: lease
tiers:
  t:
    - {unit: hour, requests_per_unit: 5}
    - {unit: minute, requests_per_unit: 1, consistency: approximate}
descriptors:
  - key: plain
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: own
    rate_limit: {unit: hour, requests_per_unit: 1, consistency: strict}
  - key: log
    rate_limit: {unit: hour, requests_per_unit: 1, algorithm: sliding_window_log}
  - key: list
    rate_limits:
      - {unit: hour, requests_per_unit: 1, algorithm: token_bucket, consistency: approximate}
      - {unit: day, requests_per_unit: 1}
  - key: tier
    tier: t
---
domain: b
descriptors:
  - key: plain
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: own
    rate_limit: {unit: hour, requests_per_unit: 1, algorithm: gcra, consistency: approximate}
`)
	for _, tc := range []struct {
		domain, key string
		want        []Consistency
	}{
		{"a", "plain", []Consistency{ConsistencyLease}},
		{"a", "own", []Consistency{ConsistencyStrict}},
		{"a", "log", []Consistency{ConsistencyStrict}},
		{"a", "list", []Consistency{ConsistencyApproximate, ConsistencyLease}},
		{"a", "tier", []Consistency{ConsistencyLease, ConsistencyApproximate}},
		{"b", "plain", []Consistency{ConsistencyUnset}},
		{"b", "own", []Consistency{ConsistencyApproximate}},
	} {
		p := mustDomain(t, c, tc.domain).Match(entries(tc.key+"=x"), nil)
		if len(p) == 0 {
			t.Fatalf("%s %s: no match", tc.domain, tc.key)
		}
		ls := p[len(p)-1].Limits
		if len(ls) != len(tc.want) {
			t.Fatalf("%s %s: %d limits, want %d", tc.domain, tc.key, len(ls), len(tc.want))
		}
		for i, l := range ls {
			if l.Consistency != tc.want[i] {
				t.Errorf("%s %s limit %d: %v, want %v", tc.domain, tc.key, i, l.Consistency, tc.want[i])
			}
		}
	}
	if a, b := mustDomain(t, c, "a").DefaultConsistency, mustDomain(t, c, "b").DefaultConsistency; a != ConsistencyLease || b != ConsistencyUnset {
		t.Errorf("file defaults %v and %v, want lease and unset", a, b)
	}
	for _, name := range []string{"strict", "lease", "approximate"} {
		var v Consistency
		if err := v.UnmarshalText([]byte(name)); err != nil || v.String() != name {
			t.Errorf("%s: %v %v", name, v, err)
		}
	}
	var v Consistency
	if err := v.UnmarshalText([]byte("")); err == nil {
		t.Errorf("empty consistency accepted")
	}
}
