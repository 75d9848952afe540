package deploy_test

import (
	"encoding/json"
	"fmt"
	"testing"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/encoding/protojson"
	istioapi "istio.io/api/networking/v1alpha3"
	istionet "istio.io/client-go/pkg/apis/networking/v1alpha3"
	corev1 "k8s.io/api/core/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
)

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
