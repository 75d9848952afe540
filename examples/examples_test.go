// Package examples holds the example configs; its test checks them.
package examples

import (
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"

	matcherv3 "github.com/cncf/xds/go/xds/type/matcher/v3"
	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	rlqsfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	typematcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"gopkg.in/yaml.v3"

	"github.com/envoyrls/envoy-rls/pkg/descriptors"
)

// bootstrap parses an example bootstrap into Envoy's bootstrap proto
// (unknown fields are errors) and runs Envoy's validation rules on it.
func bootstrap(t *testing.T, file string) *bootstrapv3.Bootstrap {
	t.Helper()
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var doc any
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	js, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	var bs bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(js, &bs); err != nil {
		t.Fatalf("%s is not a valid bootstrap: %v", file, err)
	}
	if err := bs.ValidateAll(); err != nil {
		t.Fatalf("%s: bootstrap validation: %v", file, err)
	}
	return &bs
}

// TestEnvoyBootstrapIsValid parses envoy.yaml into Envoy's bootstrap proto
// (unknown fields are errors) and runs Envoy's validation rules on it and on
// the typed configs of the HTTP connection manager and rate limit filter.
func TestEnvoyBootstrapIsValid(t *testing.T) {
	bs := bootstrap(t, "envoy.yaml")
	listeners := bs.GetStaticResources().GetListeners()
	if len(listeners) != 1 {
		t.Fatalf("want 1 listener, got %d", len(listeners))
	}
	var hcm hcmv3.HttpConnectionManager
	if err := listeners[0].FilterChains[0].Filters[0].GetTypedConfig().UnmarshalTo(&hcm); err != nil {
		t.Fatal(err)
	}
	if err := hcm.ValidateAll(); err != nil {
		t.Fatalf("http connection manager: %v", err)
	}
	var rl ratelimitv3.RateLimit
	if err := hcm.HttpFilters[0].GetTypedConfig().UnmarshalTo(&rl); err != nil {
		t.Fatal(err)
	}
	if err := rl.ValidateAll(); err != nil {
		t.Fatalf("rate limit filter: %v", err)
	}
	if rl.RateLimitService.GetGrpcService().GetEnvoyGrpc().GetClusterName() != "ratelimit" {
		t.Fatalf("rate limit filter does not call the ratelimit cluster")
	}

	// The domain and descriptor keys Envoy sends must exist in the example
	// descriptor config.
	cfg, err := descriptors.Load("ratelimit.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dom := cfg.Domain(rl.Domain)
	if dom == nil {
		t.Fatalf("envoy.yaml uses domain %q, which ratelimit.yaml does not define", rl.Domain)
	}
	for _, req := range [][]descriptors.Entry{
		{{Key: "remote_address", Value: "10.0.0.1"}},
		{{Key: "path", Value: "/login"}},
		{{Key: "plan", Value: "free"}, {Key: "user", Value: "u1"}},
	} {
		path := dom.Match(req, nil)
		if len(path) == 0 || len(path[len(path)-1].Limits) == 0 {
			t.Errorf("descriptor %v that envoy.yaml sends matches no limit", req)
		}
	}
	if len(hcm.GetRouteConfig().GetVirtualHosts()[0].Routes[0].GetRoute().GetRateLimits()) != 3 {
		t.Errorf("want 3 rate limit actions on the route")
	}
}

// TestExampleConfigLoads checks that the example descriptor config is valid.
func TestExampleConfigLoads(t *testing.T) {
	if _, err := descriptors.Load("ratelimit.yaml"); err != nil {
		t.Fatalf("examples/ratelimit.yaml:\n%v", err)
	}
}

// TestEnvoyRLQSBootstrapIsValid: envoy-rlqs.yaml is a valid bootstrap whose
// rate_limit_quota filter (and every bucket's settings) passes Envoy's
// validation rules, points at the ratelimit cluster with ratelimit.yaml's
// domain, follows docs/rlqs.md's safe settings (blanket-only
// no_assignment_behavior, a fallback_rate_limit with a whole-second timeout
// for expired assignments), and builds bucket ids that match descriptors
// with limits order-free, in a config that loads with --rlqs.
func TestEnvoyRLQSBootstrapIsValid(t *testing.T) {
	bs := bootstrap(t, "envoy-rlqs.yaml")
	var hcm hcmv3.HttpConnectionManager
	if err := bs.GetStaticResources().GetListeners()[0].FilterChains[0].Filters[0].GetTypedConfig().UnmarshalTo(&hcm); err != nil {
		t.Fatal(err)
	}
	if err := hcm.ValidateAll(); err != nil {
		t.Fatalf("http connection manager: %v", err)
	}
	var f rlqsfilterv3.RateLimitQuotaFilterConfig
	if err := hcm.HttpFilters[0].GetTypedConfig().UnmarshalTo(&f); err != nil {
		t.Fatal(err)
	}
	if err := f.ValidateAll(); err != nil {
		t.Fatalf("rate_limit_quota filter: %v", err)
	}
	if f.GetRlqsServer().GetEnvoyGrpc().GetClusterName() != "ratelimit" {
		t.Fatal("the filter does not call the ratelimit cluster")
	}
	cfg, err := descriptors.LoadWith("ratelimit.yaml", descriptors.Options{OrderFree: true})
	if err != nil {
		t.Fatalf("ratelimit.yaml with --rlqs: %v", err)
	}
	dom := cfg.Domain(f.GetDomain())
	if dom == nil {
		t.Fatalf("domain %q is not in ratelimit.yaml", f.GetDomain())
	}
	var actions []*matcherv3.Matcher_OnMatch
	for _, m := range f.GetBucketMatchers().GetMatcherList().GetMatchers() {
		actions = append(actions, m.GetOnMatch())
	}
	actions = append(actions, f.GetBucketMatchers().GetOnNoMatch())
	// What the header inputs of the example give, per header.
	headers := map[string]string{"x-user": "u1", "x-plan": "free"}
	for i, a := range actions {
		var b rlqsfilterv3.RateLimitQuotaBucketSettings
		if err := a.GetAction().GetTypedConfig().UnmarshalTo(&b); err != nil {
			t.Fatalf("action %d: %v", i, err)
		}
		if err := b.ValidateAll(); err != nil {
			t.Fatalf("action %d: %v", i, err)
		}
		if b.GetNoAssignmentBehavior().GetFallbackRateLimit().GetBlanketRule() != 0 || b.GetNoAssignmentBehavior().GetFallbackRateLimit().GetTokenBucket() != nil {
			t.Errorf("action %d: no_assignment_behavior must be blanket ALLOW_ALL in this example", i)
		}
		exp := b.GetExpiredAssignmentBehavior()
		if exp.GetFallbackRateLimit().GetTokenBucket() == nil || exp.GetExpiredAssignmentBehaviorTimeout().GetNanos() != 0 || exp.GetExpiredAssignmentBehaviorTimeout().GetSeconds() < 1 {
			t.Errorf("action %d: expired_assignment_behavior must be a token bucket fallback with a whole-second timeout", i)
		}
		var bucket []descriptors.Entry
		for k, v := range b.GetBucketIdBuilder().GetBucketIdBuilder() {
			val := v.GetStringValue()
			if cv := v.GetCustomValue(); cv != nil {
				var in typematcherv3.HttpRequestHeaderMatchInput
				if err := cv.GetTypedConfig().UnmarshalTo(&in); err != nil {
					t.Fatalf("action %d: %s: %v", i, k, err)
				}
				val = headers[in.GetHeaderName()]
			}
			bucket = append(bucket, descriptors.Entry{Key: k, Value: val})
		}
		slices.SortFunc(bucket, func(x, y descriptors.Entry) int { return strings.Compare(x.Key, y.Key) })
		_, path := dom.MatchBucket(bucket, nil, nil)
		if len(path) == 0 || len(path[len(path)-1].Limits) == 0 {
			t.Errorf("action %d: bucket %v matches no limit of ratelimit.yaml", i, bucket)
		}
	}
}
