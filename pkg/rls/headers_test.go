package rls_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dunglas/httpsfv"
	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/envoyrls/envoy-rls/internal/testutil"
	"github.com/envoyrls/envoy-rls/pkg/backend/memory"
	"github.com/envoyrls/envoy-rls/pkg/rlheaders"
	"github.com/envoyrls/envoy-rls/pkg/rls"
)

func headerMap(r *rlsv3.RateLimitResponse) map[string]string {
	m := map[string]string{}
	for _, hv := range r.ResponseHeadersToAdd {
		if _, dup := m[hv.Key]; dup {
			m[hv.Key] += "\x00dup"
		}
		m[hv.Key] = hv.Value
	}
	return m
}

// parseFields parses RateLimit-Policy and RateLimit with a Structured Field
// parser, checking the draft's grammar: Lists of String Items with only the
// draft's parameters, typed as the draft says.
func parseFields(t *testing.T, h map[string]string) (pols []sfPolicy, name string, r, reset int64, pk []byte) {
	t.Helper()
	list, err := httpsfv.UnmarshalList([]string{h["RateLimit-Policy"]})
	if err != nil || len(list) == 0 {
		t.Fatalf("RateLimit-Policy %q: %v", h["RateLimit-Policy"], err)
	}
	for _, m := range list {
		it := m.(httpsfv.Item)
		p := sfPolicy{name: it.Value.(string)}
		for _, k := range it.Params.Names() {
			v, _ := it.Params.Get(k)
			switch k {
			case "q":
				p.q = v.(int64)
			case "w":
				p.w = v.(int64)
			case "pk":
				p.pk = v.([]byte)
			default:
				t.Fatalf("unexpected parameter %q", k)
			}
		}
		pols = append(pols, p)
	}
	rl, err := httpsfv.UnmarshalList([]string{h["RateLimit"]})
	if err != nil || len(rl) != 1 {
		t.Fatalf("RateLimit %q: %v", h["RateLimit"], err)
	}
	it := rl[0].(httpsfv.Item)
	name = it.Value.(string)
	r, reset = -1, -1
	for _, k := range it.Params.Names() {
		v, _ := it.Params.Get(k)
		switch k {
		case "r":
			r = v.(int64)
		case "t":
			reset = v.(int64)
		case "pk":
			pk = v.([]byte)
		default:
			t.Fatalf("unexpected parameter %q", k)
		}
	}
	return pols, name, r, reset, pk
}

func TestParseHeaderMode(t *testing.T) {
	for in, want := range map[string]rls.HeaderMode{
		"off": rls.HeadersOff, "false": rls.HeadersOff, "true": rls.HeadersLegacy, "legacy": rls.HeadersLegacy,
		"ietf": rls.HeadersIETF, "IETF": rls.HeadersIETF, "draft03": rls.HeadersDraft03, "all": rls.HeadersAll,
	} {
		got, err := rls.ParseHeaderMode(in)
		if err != nil || got != want {
			t.Errorf("rls.ParseHeaderMode(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	if _, err := rls.ParseHeaderMode("draft04"); err == nil || !strings.Contains(err.Error(), "want off, ietf, draft03, legacy or all") {
		t.Errorf("bad mode: %v", err)
	}
	for _, m := range []rls.HeaderMode{rls.HeadersOff, rls.HeadersLegacy, rls.HeadersIETF, rls.HeadersDraft03, rls.HeadersAll} {
		if back, _ := rls.ParseHeaderMode(m.String()); back != m {
			t.Errorf("%v does not round-trip", m)
		}
	}
}

func TestIETFHeadersSingleLimit(t *testing.T) {
	h := start(t, observeYAML, rls.Options{ResponseHeaders: rls.HeadersIETF})
	got := headerMap(h.call(t, "obs", desc("user", "alice")))
	pols, name, r, reset, pk := parseFields(t, got)
	if len(pols) != 1 || pols[0].name != "per-user" || pols[0].q != 5 || pols[0].w != 60 {
		t.Errorf("policy %+v", pols)
	}
	// A key-only descriptor: one counter per user, so a partition key.
	if len(pols[0].pk) != 8 || string(pk) != string(pols[0].pk) {
		t.Errorf("pk %x / %x, want the counter's 8-byte tag in both", pols[0].pk, pk)
	}
	if name != "per-user" || r != 4 || reset != 50 {
		t.Errorf("RateLimit %q r=%d t=%d, want per-user r=4 t=50", name, r, reset)
	}
	// Another user is another partition.
	other := headerMap(h.call(t, "obs", desc("user", "bob")))
	if _, _, _, _, pk2 := parseFields(t, other); string(pk2) == string(pk) {
		t.Errorf("two users share pk %x", pk)
	}
	if _, ok := got["RateLimit-Limit"]; ok {
		t.Errorf("ietf mode added legacy fields: %v", got)
	}
	if _, ok := got["Retry-After"]; ok {
		t.Errorf("Retry-After on an allowed answer")
	}
}

func TestIETFHeadersComposite(t *testing.T) {
	h := start(t, observeYAML, rls.Options{ResponseHeaders: rls.HeadersIETF})
	got := headerMap(h.call(t, "obs", desc("api", "k")))
	pols, name, r, reset, _ := parseFields(t, got)
	if len(pols) != 2 || pols[0].name != "api-minute" || pols[0].q != 100 || pols[0].w != 60 ||
		pols[1].name != "api-second" || pols[1].q != 2 || pols[1].w != 1 {
		t.Fatalf("policy %+v", pols)
	}
	if name != "api-second" || r != 1 || reset != 1 {
		t.Errorf("RateLimit %q r=%d t=%d, want api-second r=1 t=1", name, r, reset)
	}
	// Unnamed composite limits get distinct names.
	pols, _, _, _, _ = parseFields(t, headerMap(h.call(t, "obs", desc("bare", "x"))))
	if len(pols) != 2 || pols[0].name != "bare#0" || pols[1].name != "bare#1" {
		t.Errorf("unnamed composite %+v", pols)
	}
}

func TestIETFHeadersTier(t *testing.T) {
	h := start(t, observeYAML, rls.Options{ResponseHeaders: rls.HeadersIETF})
	got := headerMap(h.call(t, "obs", desc("plan", "gold")))
	pols, name, r, _, pk := parseFields(t, got)
	if len(pols) != 2 || pols[0].name != "gold-hourly" || pols[0].w != 3600 || pols[1].name != "gold-daily" || pols[1].w != 86400 || pols[1].q != 5000 {
		t.Fatalf("policy %+v", pols)
	}
	// A fixed value: one shared counter, no partition key.
	if pols[0].pk != nil || pk != nil {
		t.Errorf("pk on a shared counter")
	}
	if name != "gold-hourly" || r != 999 {
		t.Errorf("RateLimit %q r=%d", name, r)
	}
}

func TestIETFHeadersWindow90s(t *testing.T) {
	h := start(t, observeYAML, rls.Options{ResponseHeaders: rls.HeadersIETF | rls.HeadersDraft03})
	got := headerMap(h.call(t, "obs", desc("slow", "x")))
	pols, name, r, reset, _ := parseFields(t, got)
	if len(pols) != 1 || pols[0].name != "slow" || pols[0].q != 7 || pols[0].w != 90 {
		t.Fatalf("policy %+v", pols)
	}
	// base is 10 s into a minute; 90 s windows are epoch-aligned.
	wantReset := int64(90 - base.Unix()%90)
	if name != "slow" || r != 6 || reset != wantReset {
		t.Errorf("RateLimit %q r=%d t=%d, want slow r=6 t=%d", name, r, reset, wantReset)
	}
	if got["X-RateLimit-Limit"] != `7, 7;w=90;name="slow"` || got["X-RateLimit-Remaining"] != "6" || got["X-RateLimit-Reset"] != strconv.FormatInt(wantReset, 10) {
		t.Errorf("draft03 %q %q %q", got["X-RateLimit-Limit"], got["X-RateLimit-Remaining"], got["X-RateLimit-Reset"])
	}
	if l, err := httpsfv.UnmarshalList([]string{got["X-RateLimit-Limit"]}); err != nil || len(l) != 2 {
		t.Errorf("X-RateLimit-Limit does not parse as a list: %v", err)
	}
}

func TestOverLimitTellsTheClientAndEnvoy(t *testing.T) {
	body, err := rls.ParseBodyTemplate(`{"error":"rate_limited","rule":"{{rule}}","retry_after":{{retry_after}}}`)
	if err != nil {
		t.Fatal(err)
	}
	h := start(t, observeYAML, rls.Options{ResponseHeaders: rls.HeadersAll, OverLimitBody: body})
	for i := 0; i < 2; i++ {
		h.call(t, "obs", desc("user", "carol"), desc("api", "k"))
	}
	r := h.call(t, "obs", desc("user", "carol"), desc("api", "k"))
	if r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("3rd call within 1 s: %v", r)
	}
	got := headerMap(h.call(t, "obs", desc("user", "carol"), desc("api", "k")))
	pols, name, rem, reset, _ := parseFields(t, got)
	if len(pols) != 3 {
		t.Errorf("policies %+v", pols)
	}
	if name != "api-second" || rem != 0 || reset != 1 {
		t.Errorf("RateLimit %q r=%d t=%d, want api-second r=0 t=1", name, rem, reset)
	}
	if got["Retry-After"] != "1" {
		t.Errorf("Retry-After %q, want 1", got["Retry-After"])
	}
	if !strings.HasPrefix(got["X-RateLimit-Limit"], "2, 5;w=60;name=\"per-user\", 100;w=60;name=\"api-minute\", 2;w=1;name=\"api-second\"") || got["X-RateLimit-Remaining"] != "0" {
		t.Errorf("draft03 %q / %q", got["X-RateLimit-Limit"], got["X-RateLimit-Remaining"])
	}
	if got["RateLimit-Limit"] != "2" || got["RateLimit-Remaining"] != "0" || got["RateLimit-Reset"] != "1" {
		t.Errorf("legacy %v", got)
	}
	for k, v := range got {
		if strings.Contains(v, "\x00dup") {
			t.Errorf("header %s added twice", k)
		}
	}
	r = h.call(t, "obs", desc("user", "carol"), desc("api", "k"))
	meta := r.DynamicMetadata.GetFields()[rls.MetadataKey].GetStructValue().GetFields()
	if meta["rule"].GetStringValue() != "api-second" || meta["domain"].GetStringValue() != "obs" || meta["descriptor_index"].GetNumberValue() != 1 {
		t.Errorf("dynamic metadata %v", r.DynamicMetadata)
	}
	if want := `{"error":"rate_limited","rule":"api-second","retry_after":1}`; string(r.RawBody) != want {
		t.Errorf("raw_body %s, want %s", r.RawBody, want)
	}
	// Retry-After comes whatever the header mode, and unnamed rules are
	// named by their path.
	h2 := start(t, observeYAML, rls.Options{})
	h2.call(t, "obs", desc("shadowed", "x"))
	for i := 0; i < 5; i++ {
		h2.call(t, "obs", desc("user", "dave"))
	}
	r = h2.call(t, "obs", desc("shadowed", "x"), desc("user", "dave"))
	g := headerMap(r)
	if r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || g["Retry-After"] != "50" || len(g) != 1 || r.RawBody != nil {
		t.Errorf("headers off: %v, body %q", g, r.RawBody)
	}
	if rule := r.DynamicMetadata.GetFields()[rls.MetadataKey].GetStructValue().GetFields()["rule"].GetStringValue(); rule != "per-user" {
		t.Errorf("denying rule %q, want per-user (the shadow limit denies nothing)", rule)
	}
}

func TestResponseHeaders(t *testing.T) {
	h := start(t, featuresYAML, rls.Options{ResponseHeaders: rls.HeadersLegacy})
	headers := func(r *rlsv3.RateLimitResponse) map[string]string {
		m := map[string]string{}
		for _, hv := range r.ResponseHeadersToAdd {
			m[hv.Key] = hv.Value
		}
		return m
	}
	// small (1/min) and big (10/min): small binds, 0 left, 50 s to reset.
	r := h.call(t, "f", desc("big", "h"), desc("small", "h"))
	got := headers(r)
	if got["RateLimit-Limit"] != "1" || got["RateLimit-Remaining"] != "0" || got["RateLimit-Reset"] != "50" {
		t.Fatalf("headers %v", got)
	}
	// Denied: the denying descriptor is described.
	r = h.call(t, "f", desc("big", "h"), desc("small", "h"))
	got = headers(r)
	if r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || got["RateLimit-Limit"] != "1" || got["RateLimit-Reset"] != "50" {
		t.Fatalf("denied headers %v", got)
	}
	// No limit applies: no headers.
	if r := h.call(t, "f", desc("nothing", "x")); len(r.ResponseHeadersToAdd) != 0 {
		t.Fatalf("headers without a limit: %v", r.ResponseHeadersToAdd)
	}
	// Off by default.
	h2 := start(t, featuresYAML, rls.Options{})
	if r := h2.call(t, "f", desc("big", "h")); len(r.ResponseHeadersToAdd) != 0 {
		t.Fatalf("headers while off: %v", r.ResponseHeadersToAdd)
	}
}

// TestResponseHeaderNames: the reference's LIMIT_*_HEADER names the three
// fields; a name left empty keeps its default.
func TestResponseHeaderNames(t *testing.T) {
	h := start(t, featuresYAML, rls.Options{ResponseHeaders: rls.HeadersLegacy,
		LegacyHeaderNames: rlheaders.LegacyNames{Limit: "X-Quota-Limit", Reset: "X-Quota-Reset"}})
	r := h.call(t, "f", desc("big", "h"), desc("small", "h"))
	var got []string
	for _, hv := range r.ResponseHeadersToAdd {
		got = append(got, hv.Key+": "+hv.Value)
	}
	if want := "X-Quota-Limit: 1|RateLimit-Remaining: 0|X-Quota-Reset: 50"; strings.Join(got, "|") != want {
		t.Fatalf("headers %q, want %q", strings.Join(got, "|"), want)
	}
}

// TestEveryFieldTellsTheSameWait: a request that can never pass on a fixed
// window (6 hits of 5 a minute) is told one wait everywhere, the time to
// the window's end as duration_until_reset says it (the reference's rule):
// Retry-After, the IETF and draft 03 resets, the legacy reset and the body.
func TestEveryFieldTellsTheSameWait(t *testing.T) {
	body, err := rls.ParseBodyTemplate(`{"retry_after":{{retry_after}}}`)
	if err != nil {
		t.Fatal(err)
	}
	clock := testutil.NewClock(base) // 10 s into a minute
	store := memory.New(memory.WithClock(clock))
	t.Cleanup(func() { store.Close() })
	h := serve(t, observeYAML, rls.Options{Clock: clock, ResponseHeaders: rls.HeadersAll, OverLimitBody: body}, store, clock)
	r, err := h.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "obs", HitsAddend: 6, Descriptors: []*commonv3.RateLimitDescriptor{desc("user", "z")}})
	if err != nil || r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("6 hits of 5: %v %v", r, err)
	}
	if d := r.Statuses[0].DurationUntilReset.AsDuration(); d != 50*time.Second {
		t.Fatalf("duration_until_reset %v, want 50s (the window's end)", d)
	}
	got := headerMap(r)
	_, name, _, reset, _ := parseFields(t, got)
	if name != "per-user" || reset != 50 {
		t.Errorf("RateLimit %q t=%d, want per-user t=50", name, reset)
	}
	for _, f := range []string{"Retry-After", "X-RateLimit-Reset", "RateLimit-Reset"} {
		if got[f] != "50" {
			t.Errorf("%s: %q, want 50", f, got[f])
		}
	}
	if string(r.RawBody) != `{"retry_after":50}` {
		t.Errorf("body %s", r.RawBody)
	}
}
