package rlheaders

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/dunglas/httpsfv"
)

// policyItem is one parsed member of RateLimit-Policy.
type policyItem struct {
	name string
	q, w int64
	pk   []byte
}

// limitItem is the parsed RateLimit field.
type limitItem struct {
	name string
	r, t int64
	pk   []byte
}

// parseIETF parses both fields with a Structured Field parser and checks
// them against the draft's grammar: a non-empty List of Items whose values
// are Strings, with only the draft's parameters, of the draft's types.
func parseIETF(t *testing.T, policy, ratelimit string) ([]policyItem, limitItem) {
	t.Helper()
	pl, err := httpsfv.UnmarshalList([]string{policy})
	if err != nil {
		t.Fatalf("RateLimit-Policy %q is no Structured Field List: %v", policy, err)
	}
	if len(pl) == 0 {
		t.Fatalf("RateLimit-Policy %q is empty", policy)
	}
	var out []policyItem
	for i, m := range pl {
		it, ok := m.(httpsfv.Item)
		if !ok {
			t.Fatalf("RateLimit-Policy member %d is %T, want an Item", i, m)
		}
		name, ok := it.Value.(string)
		if !ok {
			t.Fatalf("RateLimit-Policy member %d value is %T, want a String", i, it.Value)
		}
		p := policyItem{name: name, q: -1, w: -1}
		for _, k := range it.Params.Names() {
			v, _ := it.Params.Get(k)
			switch k {
			case "q":
				p.q = mustInt(t, "q", v)
			case "w":
				p.w = mustInt(t, "w", v)
			case "pk":
				b, ok := v.([]byte)
				if !ok {
					t.Fatalf("pk is %T, want a Byte Sequence", v)
				}
				p.pk = b
			default:
				t.Fatalf("RateLimit-Policy member %d has parameter %q the draft does not define", i, k)
			}
		}
		if p.q < 0 {
			t.Fatalf("RateLimit-Policy member %d has no q", i)
		}
		if p.w < 1 {
			t.Fatalf("RateLimit-Policy member %d has w %d, want a positive window", i, p.w)
		}
		out = append(out, p)
	}
	rl, err := httpsfv.UnmarshalList([]string{ratelimit})
	if err != nil {
		t.Fatalf("RateLimit %q is no Structured Field List: %v", ratelimit, err)
	}
	if len(rl) != 1 {
		t.Fatalf("RateLimit %q has %d members, want the binding policy only", ratelimit, len(rl))
	}
	it, ok := rl[0].(httpsfv.Item)
	if !ok {
		t.Fatalf("RateLimit member is %T, want an Item", rl[0])
	}
	l := limitItem{r: -1, t: -1}
	if l.name, ok = it.Value.(string); !ok {
		t.Fatalf("RateLimit value is %T, want a String", it.Value)
	}
	for _, k := range it.Params.Names() {
		v, _ := it.Params.Get(k)
		switch k {
		case "r":
			l.r = mustInt(t, "r", v)
		case "t":
			l.t = mustInt(t, "t", v)
		case "pk":
			b, ok := v.([]byte)
			if !ok {
				t.Fatalf("pk is %T, want a Byte Sequence", v)
			}
			l.pk = b
		default:
			t.Fatalf("RateLimit has parameter %q the draft does not define", k)
		}
	}
	if l.r < 0 || l.t < 0 {
		t.Fatalf("RateLimit %q lacks r or t", ratelimit)
	}
	found := false
	for _, p := range out {
		found = found || (p.name == l.name && bytes.Equal(p.pk, l.pk))
	}
	if !found {
		t.Fatalf("RateLimit names %q, which RateLimit-Policy %q does not list", l.name, policy)
	}
	return out, l
}

func mustInt(t *testing.T, name string, v any) int64 {
	t.Helper()
	i, ok := v.(int64)
	if !ok {
		t.Fatalf("%s is %T, want an Integer", name, v)
	}
	return i
}

func TestIETFSingleLimit(t *testing.T) {
	ps := []Policy{{Name: "per-ip", Quota: 5, Window: time.Second, Remaining: 4, Reset: 200 * time.Millisecond}}
	policy, rl := IETF(ps)
	got, l := parseIETF(t, policy, rl)
	if len(got) != 1 || got[0].name != "per-ip" || got[0].q != 5 || got[0].w != 1 || got[0].pk != nil {
		t.Errorf("policy = %+v", got)
	}
	if l.name != "per-ip" || l.r != 4 || l.t != 1 || l.pk != nil {
		t.Errorf("ratelimit = %+v", l)
	}
}

func TestIETFCompositeListsEveryLimitAndPicksTheBindingOne(t *testing.T) {
	ps := []Policy{
		{Name: "per-minute", Quota: 100, Window: time.Minute, Remaining: 99, Reset: 60 * time.Second},
		{Name: "per-second", Quota: 5, Window: time.Second, Remaining: 4, Reset: 200 * time.Millisecond, PartitionKey: []byte("k1")},
		{Name: "per-10s", Quota: 20, Window: 10 * time.Second, Remaining: 19, Reset: 10 * time.Second},
	}
	policy, rl := IETF(ps)
	got, l := parseIETF(t, policy, rl)
	want := []policyItem{{"per-minute", 100, 60, nil}, {"per-second", 5, 1, []byte("k1")}, {"per-10s", 20, 10, nil}}
	if len(got) != len(want) {
		t.Fatalf("policy %q has %d items, want %d", policy, len(got), len(want))
	}
	for i := range want {
		if got[i].name != want[i].name || got[i].q != want[i].q || got[i].w != want[i].w || !bytes.Equal(got[i].pk, want[i].pk) {
			t.Errorf("policy item %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	if l.name != "per-second" || l.r != 4 || l.t != 1 || string(l.pk) != "k1" {
		t.Errorf("ratelimit = %+v, want per-second r=4 t=1 pk=k1", l)
	}
}

func TestIETFTierNamesEachLimitOfTheTier(t *testing.T) {
	// A tier is a named list of limits: each becomes its own policy.
	ps := []Policy{
		{Name: "free/hourly", Quota: 1000, Window: time.Hour, Remaining: 10, Reset: 30 * time.Minute},
		{Name: "free/daily", Quota: 5000, Window: 24 * time.Hour, Remaining: 9, Reset: 20 * time.Hour},
	}
	policy, rl := IETF(ps)
	got, l := parseIETF(t, policy, rl)
	if got[0].w != 3600 || got[1].w != 86400 || got[0].q != 1000 || got[1].q != 5000 {
		t.Errorf("policy = %+v", got)
	}
	if l.name != "free/daily" || l.r != 9 || l.t != 72000 {
		t.Errorf("ratelimit = %+v, want free/daily with the least remaining", l)
	}
}

func TestIETFWindowNoProtoUnitExpresses(t *testing.T) {
	ps := []Policy{{Name: "ninety", Quota: 7, Window: 90 * time.Second, Remaining: 6, Reset: 89500 * time.Millisecond}}
	policy, rl := IETF(ps)
	got, l := parseIETF(t, policy, rl)
	if got[0].w != 90 || got[0].q != 7 {
		t.Errorf("policy = %+v, want q=7 w=90", got[0])
	}
	if l.t != 90 {
		t.Errorf("t = %d, want 90 (89.5 s rounded up)", l.t)
	}
	// A sub-second window is at least 1 s.
	policy, rl = IETF([]Policy{{Name: "fast", Quota: 1, Window: 1500 * time.Millisecond}, {Name: "tiny", Quota: 1, Window: time.Millisecond}})
	got, _ = parseIETF(t, policy, rl)
	if got[0].w != 2 || got[1].w != 1 {
		t.Errorf("policy = %+v, want w=2 and w=1", got)
	}
}

func TestIETFOverLimitBindsTheDenyingLimit(t *testing.T) {
	ps := []Policy{
		{Name: "a", Quota: 100, Window: time.Minute, Remaining: 0, Reset: 50 * time.Second},
		{Name: "b", Quota: 5, Window: time.Second, Remaining: 2, Reset: 2100 * time.Millisecond, Denied: true},
		{Name: "c", Quota: 5, Window: time.Second, Remaining: 0, Reset: 300 * time.Millisecond, Denied: true},
	}
	policy, rl := IETF(ps)
	_, l := parseIETF(t, policy, rl)
	if l.name != "b" || l.r != 2 || l.t != 3 {
		t.Errorf("ratelimit = %+v, want b (denies with the longest wait) r=2 t=3", l)
	}
	if got := RetryAfter(ps[1].Reset); got != "3" {
		t.Errorf("RetryAfter = %q, want 3", got)
	}
}

func TestIETFNamesAreValidStrings(t *testing.T) {
	ps := []Policy{{Name: "quote\" back\\slash é\x01", Quota: 1, Window: time.Second}}
	policy, rl := IETF(ps)
	got, l := parseIETF(t, policy, rl)
	if want := "quote\" back\\slash ???"; got[0].name != want || l.name != want {
		t.Errorf("name = %q / %q, want %q", got[0].name, l.name, want)
	}
}

func TestIETFHugeValuesStayIntegers(t *testing.T) {
	ps := []Policy{{Name: "big", Quota: 1 << 62, Window: 1<<63 - 1, Remaining: 1 << 62, Reset: 1<<63 - 1}}
	policy, rl := IETF(ps)
	got, l := parseIETF(t, policy, rl)
	if got[0].q != maxSFInteger || l.r != maxSFInteger || l.t != int64((1<<63-1)/time.Second)+1 {
		t.Errorf("policy %+v ratelimit %+v", got[0], l)
	}
}

func TestEmpty(t *testing.T) {
	if a, b := IETF(nil); a != "" || b != "" {
		t.Errorf("IETF(nil) = %q, %q", a, b)
	}
	if a, b, c := Draft03(nil); a != "" || b != "" || c != "" {
		t.Errorf("Draft03(nil) = %q, %q, %q", a, b, c)
	}
	if a, b, c := Legacy(nil); a != "" || b != "" || c != "" {
		t.Errorf("Legacy(nil) = %q, %q, %q", a, b, c)
	}
}

// parseDraft03Limit parses X-RateLimit-Limit as a Structured Field List: a
// first bare Integer, then one Integer per policy with w and optional name.
func parseDraft03Limit(t *testing.T, v string) (first int64, quotas []policyItem) {
	t.Helper()
	l, err := httpsfv.UnmarshalList([]string{v})
	if err != nil {
		t.Fatalf("X-RateLimit-Limit %q does not parse: %v", v, err)
	}
	for i, m := range l {
		it, ok := m.(httpsfv.Item)
		if !ok {
			t.Fatalf("member %d is %T", i, m)
		}
		n := mustInt(t, "quota", it.Value)
		if i == 0 {
			if len(it.Params.Names()) != 0 {
				t.Fatalf("first member has parameters: %q", v)
			}
			first = n
			continue
		}
		p := policyItem{q: n}
		for _, k := range it.Params.Names() {
			pv, _ := it.Params.Get(k)
			switch k {
			case "w":
				p.w = mustInt(t, "w", pv)
			case "name":
				s, ok := pv.(string)
				if !ok {
					t.Fatalf("name is %T", pv)
				}
				p.name = s
			default:
				t.Fatalf("unknown parameter %q in %q", k, v)
			}
		}
		quotas = append(quotas, p)
	}
	return first, quotas
}

func TestDraft03(t *testing.T) {
	ps := []Policy{
		{Name: "", Quota: 10, Window: time.Second, Remaining: 3, Reset: 400 * time.Millisecond},
		{Name: "daily", Quota: 1000, Window: time.Hour, Remaining: 900, Reset: 3599 * time.Second},
		{Name: "ninety", Quota: 20, Window: 90 * time.Second, Remaining: 1, Reset: 45 * time.Second},
	}
	limit, remaining, reset := Draft03(ps)
	if want := `20, 10;w=1, 1000;w=3600;name="daily", 20;w=90;name="ninety"`; limit != want {
		t.Errorf("limit = %s, want %s", limit, want)
	}
	first, qs := parseDraft03Limit(t, limit)
	if first != 20 || len(qs) != 3 || qs[2].w != 90 || qs[1].name != "daily" {
		t.Errorf("parsed %d %+v", first, qs)
	}
	if remaining != "1" || reset != "45" {
		t.Errorf("remaining, reset = %s, %s; want 1, 45", remaining, reset)
	}
	// A denying limit binds even with hits to spare.
	ps[1].Denied, ps[1].Reset = true, 10*time.Second
	limit, remaining, reset = Draft03(ps)
	if !strings.HasPrefix(limit, "1000, ") || remaining != "900" || reset != "10" {
		t.Errorf("denied: %s / %s / %s", limit, remaining, reset)
	}
}

func TestLegacyAndRetryAfter(t *testing.T) {
	ps := []Policy{{Quota: 5, Window: time.Second, Remaining: 0, Reset: 1001 * time.Millisecond, Denied: true}}
	l, r, s := Legacy(ps)
	if l != "5" || r != "0" || s != "2" {
		t.Errorf("Legacy = %s %s %s", l, r, s)
	}
	for d, want := range map[time.Duration]string{0: "1", time.Nanosecond: "1", time.Second: "1", 1001 * time.Millisecond: "2", time.Hour: "3600"} {
		if got := RetryAfter(d); got != want {
			t.Errorf("RetryAfter(%v) = %s, want %s", d, got, want)
		}
		// Retry-After is an HTTP delay-seconds: digits only.
		if strings.Trim(RetryAfter(d), "0123456789") != "" {
			t.Errorf("RetryAfter(%v) = %q is not delay-seconds", d, RetryAfter(d))
		}
	}
}

func BenchmarkIETF(b *testing.B) {
	ps := []Policy{
		{Name: "per-minute", Quota: 100, Window: time.Minute, Remaining: 99, Reset: 60 * time.Second},
		{Name: "per-second", Quota: 5, Window: time.Second, Remaining: 4, Reset: 200 * time.Millisecond},
	}
	b.ReportAllocs()
	for b.Loop() {
		IETF(ps)
	}
}

func TestValidFieldName(t *testing.T) {
	for s, want := range map[string]bool{
		"RateLimit-Limit": true, "x-quota_limit.v1": true, "a!#$%&'*+-.^_`|~z": true,
		"": false, "Rate Limit": false, "X:Y": false, "é": false, "a\n": false, "(x)": false,
	} {
		if got := ValidFieldName(s); got != want {
			t.Errorf("ValidFieldName(%q) = %v, want %v", s, got, want)
		}
	}
	if n := (LegacyNames{Remaining: "R"}).OrDefault(); n != (LegacyNames{LegacyLimit, "R", LegacyReset}) {
		t.Errorf("OrDefault: %+v", n)
	}
}
