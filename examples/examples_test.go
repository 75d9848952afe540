// Package examples holds the example configs; its test checks them.
package examples

import (
	"encoding/json"
	"os"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"gopkg.in/yaml.v3"

	"github.com/envoyrls/envoy-rls/pkg/descriptors"
)

// TestEnvoyBootstrapIsValid parses envoy.yaml into Envoy's bootstrap proto
// (unknown fields are errors) and runs Envoy's validation rules on it and on
// the typed configs of the HTTP connection manager and rate limit filter.
func TestEnvoyBootstrapIsValid(t *testing.T) {
	raw, err := os.ReadFile("envoy.yaml")
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
		t.Fatalf("envoy.yaml is not a valid bootstrap: %v", err)
	}
	if err := bs.ValidateAll(); err != nil {
		t.Fatalf("bootstrap validation: %v", err)
	}
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
