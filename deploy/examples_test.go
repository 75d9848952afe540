package deploy_test

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"gopkg.in/yaml.v3"
	istioapi "istio.io/api/networking/v1alpha3"
	istionet "istio.io/client-go/pkg/apis/networking/v1alpha3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
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

// istio is the decoded deploy/istio example.
type istioExample struct {
	filter      *ratelimitv3.RateLimit
	cluster     *clusterv3.Cluster
	descriptors []descriptorTemplate
}

func loadIstio(t *testing.T) istioExample {
	t.Helper()
	var ex istioExample
	objs := loadManifests(t, "deploy/istio/envoyfilter.yaml")
	for _, o := range objs {
		ef := o.obj.(*istionet.EnvoyFilter)
		// The spec is a proto: decode it strictly with protojson.
		var whole struct {
			Spec json.RawMessage `json:"spec"`
		}
		if err := json.Unmarshal(yamlToJSON(t, o.raw), &whole); err != nil {
			t.Fatal(err)
		}
		var spec istioapi.EnvoyFilter
		if err := protojson.Unmarshal(whole.Spec, &spec); err != nil {
			t.Fatalf("%s: spec: %v", o, err)
		}
		if ef.Namespace != "istio-system" || spec.GetWorkloadSelector().GetLabels()["istio"] != "ingressgateway" {
			t.Errorf("%s: want the ingress gateway in istio-system", o)
		}
		for i, cp := range spec.ConfigPatches {
			where := fmt.Sprintf("%s patch %d (%s)", o, i, cp.ApplyTo)
			value, err := protojson.Marshal(cp.GetPatch().GetValue())
			if err != nil {
				t.Fatal(err)
			}
			switch cp.ApplyTo {
			case istioapi.EnvoyFilter_HTTP_FILTER:
				if cp.Patch.Operation != istioapi.EnvoyFilter_Patch_INSERT_BEFORE ||
					cp.GetMatch().GetListener().GetFilterChain().GetFilter().GetSubFilter().GetName() != "envoy.filters.http.router" {
					t.Errorf("%s: insert the filter before the router", where)
				}
				var f hcmv3.HttpFilter
				if err := decodeEnvoy(value, &f); err != nil {
					t.Fatalf("%s: %v", where, err)
				}
				var rl ratelimitv3.RateLimit
				if err := f.GetTypedConfig().UnmarshalTo(&rl); err != nil {
					t.Fatalf("%s: typed_config: %v", where, err)
				}
				if err := rl.ValidateAll(); err != nil {
					t.Fatalf("%s: %v", where, err)
				}
				ex.filter = &rl
			case istioapi.EnvoyFilter_CLUSTER:
				var c clusterv3.Cluster
				if err := decodeEnvoy(value, &c); err != nil {
					t.Fatalf("%s: %v", where, err)
				}
				ex.cluster = &c
			case istioapi.EnvoyFilter_VIRTUAL_HOST:
				// A MERGE patch is a partial VirtualHost: decode it strictly,
				// validate each rate limit.
				var vh routev3.VirtualHost
				if err := protojson.Unmarshal(value, &vh); err != nil {
					t.Fatalf("%s: %v", where, err)
				}
				if len(vh.RateLimits) == 0 {
					t.Fatalf("%s: no rate_limits", where)
				}
				for j, rl := range vh.RateLimits {
					if err := rl.ValidateAll(); err != nil {
						t.Fatalf("%s: rate_limits[%d]: %v", where, j, err)
					}
					ex.descriptors = append(ex.descriptors, templateFromActions(t, fmt.Sprintf("%s rate_limits[%d]", where, j), rl))
				}
			default:
				t.Fatalf("%s: unexpected patch", where)
			}
		}
	}
	if ex.filter == nil || ex.cluster == nil || ex.descriptors == nil {
		t.Fatalf("deploy/istio: want the HTTP filter, cluster and virtual host patches")
	}
	return ex
}

func TestIstioExample(t *testing.T) {
	ex := loadIstio(t)
	k := loadK8s(t)
	// The filter calls the added cluster, which reaches envoy-rls's gRPC port
	// over HTTP/2.
	if got := ex.filter.GetRateLimitService().GetGrpcService().GetEnvoyGrpc().GetClusterName(); got != ex.cluster.Name {
		t.Errorf("the filter calls cluster %q, the patch adds %q", got, ex.cluster.Name)
	}
	eps := ex.cluster.GetLoadAssignment().GetEndpoints()
	if len(eps) != 1 || len(eps[0].LbEndpoints) != 1 {
		t.Fatalf("want one endpoint in the cluster")
	}
	sa := eps[0].LbEndpoints[0].GetEndpoint().GetAddress().GetSocketAddress()
	if sa.GetAddress() != k.serviceHost(k.service) || sa.GetPortValue() != uint32(servicePort(t, k.service, "grpc").Port) {
		t.Errorf("the cluster reaches %s:%d, envoy-rls's gRPC Service is %s:%d",
			sa.GetAddress(), sa.GetPortValue(), k.serviceHost(k.service), servicePort(t, k.service, "grpc").Port)
	}
	if ex.cluster.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"] == nil {
		t.Errorf("the cluster does not speak HTTP/2 (gRPC)")
	}
	if testing.Short() {
		return
	}
	checkDescriptorsHaveRules(t, ex.filter.Domain, configMapConfig(t), ex.descriptors, true)
}

func TestKgatewayExample(t *testing.T) {
	objs := loadManifests(t, "deploy/kgateway/ratelimit.yaml")
	ext := only[*kgwGatewayExtension](t, objs)
	tp := only[*kgwTrafficPolicy](t, objs)
	k := loadK8s(t)

	if ext.Spec.Type != "RateLimit" || ext.Spec.RateLimit == nil {
		t.Fatalf("the GatewayExtension must be of type RateLimit")
	}
	ref := ext.Spec.RateLimit.GrpcService.BackendRef
	if string(ref.Name) != k.service.Name || ref.Namespace == nil || string(*ref.Namespace) != k.namespace() ||
		ref.Port == nil || int32(*ref.Port) != servicePort(t, k.service, "grpc").Port {
		t.Errorf("the GatewayExtension's backendRef is not envoy-rls's gRPC Service: %+v", ref)
	}
	// The cross-namespace reference is granted.
	grants := all[*gwv1Grant](objs)
	granted := false
	for _, g := range grants {
		for _, f := range g.Spec.From {
			for _, to := range g.Spec.To {
				if g.Namespace == k.namespace() && string(f.Kind) == "GatewayExtension" && string(f.Namespace) == ext.Metadata.Namespace &&
					string(to.Kind) == "Service" && to.Name != nil && string(*to.Name) == k.service.Name {
					granted = true
				}
			}
		}
	}
	if !granted {
		t.Errorf("no ReferenceGrant lets the GatewayExtension reach the envoy-rls Service")
	}

	g := tp.Spec.RateLimit.Global
	if g == nil || g.ExtensionRef.Name != ext.Metadata.Name {
		t.Fatalf("the TrafficPolicy does not use the GatewayExtension")
	}
	// kgateway turns descriptor entries into Envoy actions: Generic ->
	// generic_key with its key, Header -> request_headers keyed by the header
	// name, RemoteAddress -> remote_address, Path -> request_headers ":path"
	// keyed "path".
	var templates []descriptorTemplate
	for i, d := range g.Descriptors {
		tmpl := descriptorTemplate{source: fmt.Sprintf("deploy/kgateway TrafficPolicy descriptor %d", i)}
		for _, e := range d.Entries {
			switch e.Type {
			case "Generic":
				tmpl.entries = append(tmpl.entries, templateEntry{key: e.Generic.Key, value: e.Generic.Value})
			case "Header":
				tmpl.entries = append(tmpl.entries, templateEntry{key: *e.Header})
			case "RemoteAddress":
				tmpl.entries = append(tmpl.entries, templateEntry{key: "remote_address"})
			case "Path":
				tmpl.entries = append(tmpl.entries, templateEntry{key: "path"})
			default:
				t.Fatalf("unknown kgateway descriptor entry type %q", e.Type)
			}
		}
		templates = append(templates, tmpl)
	}
	if testing.Short() {
		return
	}
	checkDescriptorsHaveRules(t, ext.Spec.RateLimit.Domain, configMapConfig(t), templates, true)
}

func TestEnvoyGatewayExample(t *testing.T) {
	k := loadK8s(t)
	cm := only[*corev1.ConfigMap](t, loadManifests(t, "deploy/envoy-gateway/envoy-gateway-config.yaml"))
	if cm.Name != "envoy-gateway-config" || cm.Namespace != "envoy-gateway-system" {
		t.Errorf("Envoy Gateway reads ConfigMap envoy-gateway-system/envoy-gateway-config, not %s/%s", cm.Namespace, cm.Name)
	}
	var eg egv1a1.EnvoyGateway
	if err := decodeStrict([]byte(cm.Data["envoy-gateway.yaml"]), &eg); err != nil {
		t.Fatalf("envoy-gateway.yaml: %v", err)
	}
	if eg.Kind != "EnvoyGateway" || eg.APIVersion != "gateway.envoyproxy.io/v1alpha1" {
		t.Errorf("envoy-gateway.yaml is a %s %s", eg.APIVersion, eg.Kind)
	}
	rd := eg.Provider.Kubernetes.RateLimitDeployment
	if rd == nil || rd.Container == nil || rd.Container.Image == nil {
		t.Fatalf("no rateLimitDeployment.container.image")
	}
	if *rd.Container.Image != k.container(t).Image {
		t.Errorf("Envoy Gateway runs %s, deploy/kubernetes runs %s", *rd.Container.Image, k.container(t).Image)
	}
	if r := rd.Container.Resources; r == nil || !equalResources(*r, k.container(t).Resources) {
		t.Errorf("the rate limit Deployment's resources differ from deploy/kubernetes's")
	}
	redis := eg.RateLimit.Backend.Redis
	want := fmt.Sprintf("%s:%d", k.serviceHost(k.redisSvc), servicePort(t, k.redisSvc, "redis").Port)
	if eg.RateLimit.Backend.Type != egv1a1.RedisBackendType || redis == nil || redis.URL == nil || *redis.URL != want {
		t.Errorf("the Redis backend is not deploy/kubernetes's Redis (%s)", want)
	}

	objs := loadManifests(t, "deploy/envoy-gateway/ratelimit.yaml")
	route := only[*gwv1.HTTPRoute](t, objs)
	gw := only[*gwv1.Gateway](t, objs)
	btp := only[*egv1a1.BackendTrafficPolicy](t, objs)
	if len(route.Spec.ParentRefs) != 1 || string(route.Spec.ParentRefs[0].Name) != gw.Name {
		t.Errorf("the HTTPRoute is not attached to the Gateway")
	}
	if len(btp.Spec.TargetRefs) != 1 || string(btp.Spec.TargetRefs[0].Name) != route.Name ||
		string(btp.Spec.TargetRefs[0].Kind) != "HTTPRoute" || btp.Namespace != route.Namespace {
		t.Errorf("the BackendTrafficPolicy does not target the HTTPRoute")
	}
	rl := btp.Spec.RateLimit
	if rl == nil || rl.Global == nil || len(rl.Global.Rules) == 0 {
		t.Fatalf("want global rate limit rules (served to envoy-rls over xDS)")
	}
	for i, r := range rl.Global.Rules {
		if r.Limit.Requests == 0 || r.Limit.Unit == "" || len(r.ClientSelectors) == 0 {
			t.Errorf("rule %d: want selectors and a limit", i)
		}
	}
}

func equalResources(a, b corev1.ResourceRequirements) bool {
	eq := func(x, y corev1.ResourceList) bool {
		if len(x) != len(y) {
			return false
		}
		for k, v := range x {
			w, ok := y[k]
			if !ok || v.Cmp(w) != 0 {
				return false
			}
		}
		return true
	}
	return eq(a.Requests, b.Requests) && eq(a.Limits, b.Limits)
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
