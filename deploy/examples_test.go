package deploy_test

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"gopkg.in/yaml.v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

func metav1LabelSelector(s *metav1.LabelSelector) (labels.Selector, error) {
	return metav1.LabelSelectorAsSelector(s)
}

// validator is what protoc-gen-validate generates on every Envoy message.
type validator interface{ ValidateAll() error }

// decodeEnvoy decodes JSON into an Envoy proto (unknown fields are errors)
// and runs Envoy's validation rules on it.
func decodeEnvoy(js []byte, m proto.Message) error {
	if err := protojson.Unmarshal(js, m); err != nil {
		return err
	}
	if v, ok := m.(validator); ok {
		return v.ValidateAll()
	}
	return nil
}

// yamlToJSON converts a YAML document into JSON.
func yamlToJSON(t *testing.T, raw []byte) []byte {
	t.Helper()
	var doc any
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	js, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// descriptorTemplate is a descriptor Envoy builds from route actions: each
// entry has a fixed key and either a fixed value or one taken from the
// request.
type descriptorTemplate struct {
	source  string
	entries []templateEntry
}

type templateEntry struct {
	key   string
	value string // fixed value; empty: from the request
}

// templateFromActions interprets Envoy's rate limit actions.
func templateFromActions(t *testing.T, source string, rl *routev3.RateLimit) descriptorTemplate {
	t.Helper()
	d := descriptorTemplate{source: source}
	for _, a := range rl.Actions {
		switch {
		case a.GetRemoteAddress() != nil:
			d.entries = append(d.entries, templateEntry{key: "remote_address"})
		case a.GetRequestHeaders() != nil:
			d.entries = append(d.entries, templateEntry{key: a.GetRequestHeaders().DescriptorKey})
		case a.GetGenericKey() != nil:
			g := a.GetGenericKey()
			key := g.DescriptorKey
			if key == "" {
				key = "generic_key"
			}
			d.entries = append(d.entries, templateEntry{key: key, value: g.DescriptorValue})
		case a.GetHeaderValueMatch() != nil:
			h := a.GetHeaderValueMatch()
			key := h.DescriptorKey
			if key == "" {
				key = "header_match"
			}
			d.entries = append(d.entries, templateEntry{key: key, value: h.DescriptorValue})
		default:
			t.Fatalf("%s: the test does not know the action %v", source, a)
		}
	}
	return d
}

// configValues returns, for each descriptor key of a domain's config, the
// values the config lists for it (wildcards made concrete) and whether a
// node of that key has no value (it takes any value).
func configValues(t *testing.T, config string) (domain string, values map[string][]string, anyValue map[string]bool) {
	t.Helper()
	type node struct {
		Key         string `yaml:"key"`
		Value       string `yaml:"value"`
		Descriptors []yaml.Node
	}
	var doc struct {
		Domain      string      `yaml:"domain"`
		Descriptors []yaml.Node `yaml:"descriptors"`
	}
	if err := yaml.Unmarshal([]byte(config), &doc); err != nil {
		t.Fatal(err)
	}
	values, anyValue = map[string][]string{}, map[string]bool{}
	var walk func([]yaml.Node)
	walk = func(ns []yaml.Node) {
		for _, n := range ns {
			var d node
			if err := n.Decode(&d); err != nil {
				t.Fatal(err)
			}
			if d.Value == "" {
				anyValue[d.Key] = true
			} else {
				values[d.Key] = append(values[d.Key], strings.ReplaceAll(d.Value, "*", "x"))
			}
			walk(d.Descriptors)
		}
	}
	walk(doc.Descriptors)
	return doc.Domain, values, anyValue
}

// samples expands a template into concrete descriptors: each entry taken
// from the request gets every value the config lists for its key, and an
// unlisted value (always when everyValue, else only when the config has a
// node that takes any value or lists none).
func samples(d descriptorTemplate, values map[string][]string, anyValue map[string]bool, everyValue bool) [][]entry {
	out := [][]entry{nil}
	for _, e := range d.entries {
		var vs []string
		if e.value != "" {
			vs = []string{e.value}
		} else {
			vs = slices.Clone(values[e.key])
			if everyValue || anyValue[e.key] || len(vs) == 0 {
				vs = append(vs, "unlisted-"+e.key)
			}
		}
		var next [][]entry
		for _, prefix := range out {
			for _, v := range vs {
				next = append(next, append(slices.Clone(prefix), entry{e.key, v}))
			}
		}
		out = next
	}
	return out
}

// checkDescriptorsHaveRules starts envoy-rls on the config and requires a
// limit to apply to every sample of every template (see samples).
func checkDescriptorsHaveRules(t *testing.T, domain, config string, templates []descriptorTemplate, everyValue bool) {
	t.Helper()
	if len(templates) == 0 {
		t.Fatal("no descriptors to check")
	}
	cfgDomain, values, anyValue := configValues(t, config)
	if cfgDomain != domain {
		t.Fatalf("the descriptors go to domain %q, the config defines %q", domain, cfgDomain)
	}
	dir := configMapDir(t, map[string]string{"ratelimit.yaml": config})
	checkConfig(t, dir)
	httpAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	p := start(t, exec.Command(envoyRLS(t), "serve", "--config", dir,
		fmt.Sprintf("--grpc-addr=127.0.0.1:%d", freePort(t)), "--http-addr="+httpAddr))
	p.waitHTTP(t, "http://"+httpAddr+"/healthz")
	n := 0
	for _, d := range templates {
		for _, s := range samples(d, values, anyValue, everyValue) {
			n++
			if !limitFor(t, httpAddr, domain, s) {
				t.Errorf("%s: descriptor %v has no rate limit in domain %q", d.source, s, domain)
			}
		}
	}
	t.Logf("%d descriptors checked", n)
	p.stop(t)
}

// TestEnvoyBootstrapDescriptorsHaveRules is the compose setup's check:
// every descriptor examples/envoy.yaml's routes send has a rule in
// examples/ratelimit.yaml, the config docker-compose.yml mounts, for every
// value that config lists and for any value where it has a catch-all.
func TestEnvoyBootstrapDescriptorsHaveRules(t *testing.T) {
	bs, rl := loadBootstrap(t)
	var templates []descriptorTemplate
	for _, l := range bs.GetStaticResources().GetListeners() {
		for _, fc := range l.FilterChains {
			for _, f := range fc.Filters {
				var hcm hcmv3.HttpConnectionManager
				if err := f.GetTypedConfig().UnmarshalTo(&hcm); err != nil {
					t.Fatal(err)
				}
				for _, vh := range hcm.GetRouteConfig().GetVirtualHosts() {
					for _, r := range vh.RateLimits {
						templates = append(templates, templateFromActions(t, "examples/envoy.yaml virtual host "+vh.Name, r))
					}
					for _, route := range vh.Routes {
						for i, r := range route.GetRoute().GetRateLimits() {
							templates = append(templates, templateFromActions(t, fmt.Sprintf("examples/envoy.yaml route %s rate_limits[%d]", route.Name, i), r))
						}
					}
				}
			}
		}
	}
	if testing.Short() {
		return
	}
	// Lenient on unlisted values: examples/ratelimit.yaml limits only the
	// free and paid plans on purpose (any other x-plan is not limited).
	checkDescriptorsHaveRules(t, rl.Domain, string(readRepoFile(t, "examples/ratelimit.yaml")), templates, false)
}

// loadBootstrap decodes and validates examples/envoy.yaml and returns it
// with its rate limit filter.
func loadBootstrap(t *testing.T) (*bootstrapv3.Bootstrap, *ratelimitv3.RateLimit) {
	t.Helper()
	var bs bootstrapv3.Bootstrap
	if err := decodeEnvoy(yamlToJSON(t, readRepoFile(t, "examples/envoy.yaml")), &bs); err != nil {
		t.Fatalf("examples/envoy.yaml: %v", err)
	}
	var rl *ratelimitv3.RateLimit
	for _, l := range bs.GetStaticResources().GetListeners() {
		for _, fc := range l.FilterChains {
			for _, f := range fc.Filters {
				var hcm hcmv3.HttpConnectionManager
				if err := f.GetTypedConfig().UnmarshalTo(&hcm); err != nil {
					t.Fatal(err)
				}
				if err := hcm.ValidateAll(); err != nil {
					t.Fatal(err)
				}
				for _, hf := range hcm.HttpFilters {
					var r ratelimitv3.RateLimit
					if hf.GetTypedConfig().UnmarshalTo(&r) == nil {
						if err := r.ValidateAll(); err != nil {
							t.Fatal(err)
						}
						rl = &r
					}
				}
			}
		}
	}
	if rl == nil {
		t.Fatal("examples/envoy.yaml has no rate limit filter")
	}
	return &bs, rl
}
