package xdsconfig_test

import (
	"strings"
	"testing"

	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/envoyrls/envoy-rls/pkg/descriptors"
	"github.com/envoyrls/envoy-rls/pkg/xdsconfig"
)

func anys(t *testing.T, ms ...proto.Message) []*anypb.Any {
	t.Helper()
	out := make([]*anypb.Any, len(ms))
	for i, m := range ms {
		a, err := anypb.New(m)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = a
	}
	return out
}

// Every field of the proto reaches the compiled config.
func TestConvertEveryField(t *testing.T) {
	meta, _ := structpb.NewStruct(map[string]any{"team": "a", "n": 2.5, "tags": []any{"x", true}})
	cfg := &rlsconf.RateLimitConfig{
		Name:   "ns/name",
		Domain: "ns/name",
		Descriptors: []*rlsconf.RateLimitDescriptor{
			{Key: "k", Value: "shadow", ShadowMode: true, RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_WEEK, RequestsPerUnit: 5, Name: "weekly"}},
			{Key: "k", Value: "quota", QuotaMode: true, Metadata: meta, RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_MONTH, RequestsPerUnit: 6}},
			{Key: "k", Value: "free", RateLimit: &rlsconf.RateLimitPolicy{Unlimited: true}},
			{Key: "k", Value: "deny", RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_YEAR}},
			{Key: "k", Value: "replacer", RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_SECOND, RequestsPerUnit: 1, Replaces: []*rlsconf.RateLimitReplace{{Name: "weekly"}}}},
			{Key: "d", DetailedMetric: true, RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_MINUTE, RequestsPerUnit: 9}},
		},
	}
	c, err := xdsconfig.Convert(anys(t, cfg))
	if err != nil {
		t.Fatal(err)
	}
	d := c.Domain("ns/name")
	node := func(k, v string) *descriptors.Node {
		p := d.Match([]descriptors.Entry{{Key: k, Value: v}}, nil)
		if len(p) != 1 {
			t.Fatalf("%s=%s matches nothing", k, v)
		}
		return p[0]
	}
	if n := node("k", "shadow"); !n.ShadowMode || n.Limits[0].Unit != "WEEK" || n.Limits[0].Name != "weekly" || !n.Limits[0].Shadow {
		t.Errorf("shadow node = %+v %+v", n, n.Limits[0])
	}
	n := node("k", "quota")
	if !n.QuotaMode || n.Limits[0].Unit != "MONTH" || n.Limits[0].RequestsPerUnit != 6 {
		t.Errorf("quota node = %+v", n)
	}
	if !proto.Equal(n.Metadata, meta) {
		t.Errorf("metadata = %v, want %v", n.Metadata, meta)
	}
	if n := node("k", "free"); !n.Limits[0].Unlimited {
		t.Errorf("unlimited node = %+v", n.Limits[0])
	}
	if n := node("k", "deny"); n.Limits[0].Unit != "YEAR" || n.Limits[0].RequestsPerUnit != 0 {
		t.Errorf("requests_per_unit 0 = %+v", n.Limits[0])
	}
	if n := node("k", "replacer"); len(n.Limits[0].Replaces) != 1 || n.Limits[0].Replaces[0] != "weekly" {
		t.Errorf("replaces = %v", n.Limits[0].Replaces)
	}
	if n := node("d", "anything"); !n.DetailedMetric || n.StatsKey([]descriptors.Entry{{Key: "d", Value: "v1"}}) != "ns/name.d_v1" {
		t.Errorf("detailed_metric node = %+v", n)
	}
}

// Invalid resources are refused with a reason naming the resource, exactly
// as the same config in a file would be.
func TestConvertRefuses(t *testing.T) {
	limit := func(p *rlsconf.RateLimitPolicy) *rlsconf.RateLimitConfig {
		return &rlsconf.RateLimitConfig{Name: "r", Domain: "dom", Descriptors: []*rlsconf.RateLimitDescriptor{{Key: "k", RateLimit: p}}}
	}
	for _, tc := range []struct {
		name string
		res  []*anypb.Any
		want string
	}{
		{"no unit", anys(t, limit(&rlsconf.RateLimitPolicy{RequestsPerUnit: 3})), "xds:r:"},
		{"unit out of the enum", anys(t, limit(&rlsconf.RateLimitPolicy{Unit: 42, RequestsPerUnit: 3})), `invalid unit "42"`},
		{"unlimited with a unit", anys(t, limit(&rlsconf.RateLimitPolicy{Unlimited: true, Unit: rlsconf.RateLimitUnit_SECOND})), "unlimited must not be combined with unit"},
		{"replaces itself", anys(t, limit(&rlsconf.RateLimitPolicy{Unit: 1, RequestsPerUnit: 1, Name: "a", Replaces: []*rlsconf.RateLimitReplace{{Name: "a"}}})), "replaces its own name"},
		{"empty key", anys(t, &rlsconf.RateLimitConfig{Domain: "dom", Descriptors: []*rlsconf.RateLimitDescriptor{{Value: "v"}}}), "key must not be empty"},
		{"empty domain", anys(t, &rlsconf.RateLimitConfig{Name: "r"}), "domain must not be empty"},
		{"duplicate domain", anys(t, &rlsconf.RateLimitConfig{Name: "a", Domain: "dom"}, &rlsconf.RateLimitConfig{Name: "b", Domain: "dom"}), `duplicate domain "dom"`},
		{"duplicate descriptor", anys(t, &rlsconf.RateLimitConfig{Domain: "dom", Descriptors: []*rlsconf.RateLimitDescriptor{{Key: "k"}, {Key: "k"}}}), "duplicate descriptor"},
		{"wrong type", anys(t, wrapperspb.String("x")), "has type"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := xdsconfig.Convert(tc.res)
			if err == nil {
				t.Fatalf("accepted: %v", c.Domains())
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not contain %q", err, tc.want)
			}
		})
	}
}

func TestConvertEmpty(t *testing.T) {
	c, err := xdsconfig.Convert(nil)
	if err != nil || c == nil || len(c.Domains()) != 0 {
		t.Fatalf("Convert(nil) = %v, %v; want an empty config", c, err)
	}
}

// Lenient (the reference's environment) changes nothing a resource can
// express, except what the reference accepts: every resource
// TestConvertRefuses refuses is still refused, a valid one loads the same
// with no warning, and an unlimited limit with a unit that is no unit is
// accepted with a warning.
func TestConvertLenient(t *testing.T) {
	lenient := descriptors.Options{Lenient: true}
	for _, tc := range []struct {
		name string
		res  []*anypb.Any
	}{
		{"no unit", anys(t, &rlsconf.RateLimitConfig{Name: "r", Domain: "dom", Descriptors: []*rlsconf.RateLimitDescriptor{{Key: "k", RateLimit: &rlsconf.RateLimitPolicy{RequestsPerUnit: 3}}}})},
		{"unlimited with a unit", anys(t, &rlsconf.RateLimitConfig{Name: "r", Domain: "dom", Descriptors: []*rlsconf.RateLimitDescriptor{{Key: "k", RateLimit: &rlsconf.RateLimitPolicy{Unlimited: true, Unit: rlsconf.RateLimitUnit_SECOND}}}})},
		{"duplicate domain", anys(t, &rlsconf.RateLimitConfig{Name: "a", Domain: "dom"}, &rlsconf.RateLimitConfig{Name: "b", Domain: "dom"})},
		{"duplicate descriptor", anys(t, &rlsconf.RateLimitConfig{Domain: "dom", Descriptors: []*rlsconf.RateLimitDescriptor{{Key: "k"}, {Key: "k"}}})},
	} {
		if c, err := xdsconfig.ConvertWith(tc.res, lenient); err == nil {
			t.Errorf("%s: accepted: %v", tc.name, c.Domains())
		}
	}
	leaf := &rlsconf.RateLimitDescriptor{Key: "remote_address", RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_HOUR, RequestsPerUnit: 3}}
	eg := &rlsconf.RateLimitConfig{Name: "gw/http", Domain: "gw/http", Descriptors: []*rlsconf.RateLimitDescriptor{
		{Key: "rule-0-match-0", Value: "rule-0-match-0", Descriptors: []*rlsconf.RateLimitDescriptor{leaf}},
		{Key: "free", RateLimit: &rlsconf.RateLimitPolicy{Unlimited: true, RequestsPerUnit: 7}},
	}}
	c, err := xdsconfig.ConvertWith(anys(t, eg), lenient)
	if err != nil || len(c.Warnings()) != 0 {
		t.Fatalf("Envoy Gateway's shape: %v, warnings %v", err, c.Warnings())
	}
	if p := c.Domain("gw/http").Match([]descriptors.Entry{{Key: "free", Value: "x"}}, nil); len(p) != 1 || !p[0].Limits[0].Unlimited {
		t.Errorf("unlimited with a count: %v", p)
	}
	odd := anys(t, &rlsconf.RateLimitConfig{Name: "r", Domain: "dom", Descriptors: []*rlsconf.RateLimitDescriptor{{Key: "k", RateLimit: &rlsconf.RateLimitPolicy{Unlimited: true, Unit: 42}}}})
	if _, err := xdsconfig.Convert(odd); err == nil {
		t.Error("unlimited with unit 42 accepted natively")
	}
	c, err = xdsconfig.ConvertWith(odd, lenient)
	if err != nil || len(c.Warnings()) != 1 || !strings.Contains(c.Warnings()[0].Error(), `xds:r:5: unit "42" beside unlimited: true is not a unit: ignored`) {
		t.Fatalf("unlimited with unit 42, lenient: %v, warnings %v", err, c.Warnings())
	}
}

// OrderFree (--rlqs) refuses over xDS what it refuses in files: a quota
// bucket that could match two descriptors; without it the same resource
// loads.
func TestConvertOrderFree(t *testing.T) {
	sec := &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_SECOND, RequestsPerUnit: 1}
	res := anys(t, &rlsconf.RateLimitConfig{Name: "r", Domain: "dom", Descriptors: []*rlsconf.RateLimitDescriptor{
		{Key: "a", Descriptors: []*rlsconf.RateLimitDescriptor{{Key: "b", RateLimit: sec}}},
		{Key: "b", Descriptors: []*rlsconf.RateLimitDescriptor{{Key: "a", RateLimit: sec}}},
	}})
	if _, err := xdsconfig.ConvertWith(res, descriptors.Options{}); err != nil {
		t.Fatalf("without OrderFree: %v", err)
	}
	_, err := xdsconfig.ConvertWith(res, descriptors.Options{OrderFree: true})
	if err == nil || !strings.Contains(err.Error(), "xds:r:") || !strings.Contains(err.Error(), "quota bucket") {
		t.Fatalf("with OrderFree: %v", err)
	}
}
