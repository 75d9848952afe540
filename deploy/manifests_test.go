package deploy_test

import (
	"bytes"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
	monv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"gopkg.in/yaml.v3"
	istionet "istio.io/client-go/pkg/apis/networking/v1alpha3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwv1b1 "sigs.k8s.io/gateway-api/apis/v1beta1"
	sigsyaml "sigs.k8s.io/yaml"
)

// object is one decoded YAML document of a manifest file.
type object struct {
	file string // relative to the repository
	doc  int    // 0-based index in the file
	raw  []byte // the document's YAML
	kind string // apiVersion/kind
	obj  any    // typed value
}

func (o object) String() string { return fmt.Sprintf("%s (document %d, %s)", o.file, o.doc+1, o.kind) }

// newTyped returns a pointer to the Go type of apiVersion/kind: the projects'
// own API types where they can be imported, else a strict schema below.
func newTyped(kind string) any {
	switch kind {
	case "v1/Namespace":
		return &corev1.Namespace{}
	case "v1/ConfigMap":
		return &corev1.ConfigMap{}
	case "v1/Service":
		return &corev1.Service{}
	case "apps/v1/Deployment":
		return &appsv1.Deployment{}
	case "policy/v1/PodDisruptionBudget":
		return &policyv1.PodDisruptionBudget{}
	case "monitoring.coreos.com/v1/ServiceMonitor":
		return &monv1.ServiceMonitor{}
	case "networking.istio.io/v1alpha3/EnvoyFilter":
		return &istionet.EnvoyFilter{}
	case "gateway.networking.k8s.io/v1/Gateway":
		return &gwv1.Gateway{}
	case "gateway.networking.k8s.io/v1/HTTPRoute":
		return &gwv1.HTTPRoute{}
	case "gateway.networking.k8s.io/v1beta1/ReferenceGrant":
		return &gwv1b1.ReferenceGrant{}
	case "gateway.envoyproxy.io/v1alpha1/BackendTrafficPolicy":
		return &egv1a1.BackendTrafficPolicy{}
	case "gateway.envoyproxy.io/v1alpha1/EnvoyGateway":
		return &egv1a1.EnvoyGateway{}
	case "gateway.envoyproxy.io/v1alpha1/Backend":
		return &egv1a1.Backend{}
	case "aigateway.envoyproxy.io/v1alpha1/AIGatewayRoute":
		return &aigwRoute{}
	case "aigateway.envoyproxy.io/v1alpha1/AIServiceBackend":
		return &aigwServiceBackend{}
	case "gateway.kgateway.dev/v1alpha1/GatewayExtension":
		return &kgwGatewayExtension{}
	case "gateway.kgateway.dev/v1alpha1/TrafficPolicy":
		return &kgwTrafficPolicy{}
	case "kustomize.config.k8s.io/v1beta1/Kustomization":
		return &kustomization{}
	}
	return nil
}

// decodeStrict decodes YAML into v the way the API server does (through
// JSON), and fails on fields v does not have and fields given twice.
func decodeStrict(raw []byte, v any) error {
	return sigsyaml.UnmarshalStrict(raw, v)
}

// loadManifests decodes every document of a YAML file under deploy/.
func loadManifests(t *testing.T, file string) []object {
	t.Helper()
	raw := readRepoFile(t, file)
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	var objs []object
	for i := 0; ; i++ {
		var node yaml.Node
		if err := dec.Decode(&node); err != nil {
			if err.Error() == "EOF" {
				break
			}
			t.Fatalf("%s: document %d: %v", file, i+1, err)
		}
		doc, err := yaml.Marshal(&node)
		if err != nil {
			t.Fatal(err)
		}
		var head struct {
			APIVersion string `yaml:"apiVersion"`
			Kind       string `yaml:"kind"`
		}
		if err := node.Decode(&head); err != nil {
			t.Fatalf("%s: document %d: %v", file, i+1, err)
		}
		kind := head.APIVersion + "/" + head.Kind
		o := object{file: file, doc: i, raw: doc, kind: kind, obj: newTyped(kind)}
		if o.obj == nil {
			t.Fatalf("%s: no Go type for %s", o, kind)
		}
		if err := decodeStrict(doc, o.obj); err != nil {
			t.Fatalf("%s: %v", o, err)
		}
		objs = append(objs, o)
	}
	if len(objs) == 0 {
		t.Fatalf("%s: no documents", file)
	}
	return objs
}

// manifestFiles lists every YAML file under deploy/ (repository paths).
func manifestFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(".", func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !e.IsDir() && (strings.HasSuffix(p, ".yaml") || strings.HasSuffix(p, ".yml")) {
			files = append(files, "deploy/"+filepath.ToSlash(p))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// only returns the single object of type T in objs.
func only[T any](t *testing.T, objs []object) T {
	t.Helper()
	var found []T
	for _, o := range objs {
		if v, ok := o.obj.(T); ok {
			found = append(found, v)
		}
	}
	if len(found) != 1 {
		var zero T
		t.Fatalf("want one %T, found %d", zero, len(found))
	}
	return found[0]
}

// all returns every object of type T in objs.
func all[T any](objs []object) []T {
	var found []T
	for _, o := range objs {
		if v, ok := o.obj.(T); ok {
			found = append(found, v)
		}
	}
	return found
}

// TestEveryManifestDecodesStrictly decodes every YAML document under deploy/
// into its Go API type; unknown fields, fields given twice and unknown kinds
// fail.
func TestEveryManifestDecodesStrictly(t *testing.T) {
	files := manifestFiles(t)
	if len(files) < 5 {
		t.Fatalf("found only %v", files)
	}
	for _, f := range files {
		for _, o := range loadManifests(t, f) {
			t.Logf("%s", o)
		}
	}
}

// TestStrictDecodingRejectsMistakes shows the decoding catches what a
// cluster would reject or silently drop.
func TestStrictDecodingRejectsMistakes(t *testing.T) {
	for name, c := range map[string]struct {
		kind, doc string
	}{
		"unknown field":       {"apps/v1/Deployment", "spec:\n  replica: 2\n"},
		"duplicate field":     {"v1/Service", "spec:\n  type: ClusterIP\n  type: NodePort\n"},
		"wrong type":          {"v1/Service", "spec:\n  ports: 8081\n"},
		"kgateway unknown":    {"gateway.kgateway.dev/v1alpha1/GatewayExtension", "spec:\n  rateLimit:\n    domian: x\n"},
		"kustomize unknown":   {"kustomize.config.k8s.io/v1beta1/Kustomization", "resource:\n  - a.yaml\n"},
		"eg unknown in limit": {"gateway.envoyproxy.io/v1alpha1/BackendTrafficPolicy", "spec:\n  rateLimit:\n    global:\n      rules:\n        - limit: {requests: 1, unit: Hour, burst: 2}\n"},
	} {
		if err := decodeStrict([]byte(c.doc), newTyped(c.kind)); err == nil {
			t.Errorf("%s: %s decoded without error:\n%s", name, c.kind, c.doc)
		}
	}
}

// kustomization is the part of kustomize's Kustomization these files use.
type kustomization struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Namespace  string   `json:"namespace,omitempty"`
	Resources  []string `json:"resources,omitempty"`
	Images     []struct {
		Name    string `json:"name"`
		NewName string `json:"newName,omitempty"`
		NewTag  string `json:"newTag,omitempty"`
		Digest  string `json:"digest,omitempty"`
	} `json:"images,omitempty"`
}

// kgateway's module is not served by the Go module proxy, so its kinds are
// checked against this strict schema, written from kgateway's API types
// (gateway.kgateway.dev/v1alpha1 GatewayExtension and TrafficPolicy), limited
// to the fields the example uses.
type kgwMeta struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace,omitempty"`
}

type kgwGatewayExtension struct {
	APIVersion string  `json:"apiVersion"`
	Kind       string  `json:"kind"`
	Metadata   kgwMeta `json:"metadata"`
	Spec       struct {
		Type      string `json:"type,omitempty"`
		RateLimit *struct {
			GrpcService struct {
				BackendRef gwv1.BackendRef `json:"backendRef"`
				Authority  *string         `json:"authority,omitempty"`
			} `json:"grpcService"`
			Domain            string `json:"domain"`
			FailOpen          *bool  `json:"failOpen,omitempty"`
			Timeout           string `json:"timeout,omitempty"`
			XRateLimitHeaders string `json:"xRateLimitHeaders,omitempty"`
		} `json:"rateLimit,omitempty"`
	} `json:"spec"`
}

type kgwTrafficPolicy struct {
	APIVersion string  `json:"apiVersion"`
	Kind       string  `json:"kind"`
	Metadata   kgwMeta `json:"metadata"`
	Spec       struct {
		TargetRefs []struct {
			Group string `json:"group"`
			Kind  string `json:"kind"`
			Name  string `json:"name"`
		} `json:"targetRefs"`
		RateLimit *struct {
			Global *struct {
				ExtensionRef struct {
					Name      string `json:"name"`
					Namespace string `json:"namespace,omitempty"`
				} `json:"extensionRef"`
				Descriptors []struct {
					Entries []struct {
						Type    string `json:"type"`
						Generic *struct {
							Key   string `json:"key"`
							Value string `json:"value"`
						} `json:"generic,omitempty"`
						Header *string `json:"header,omitempty"`
					} `json:"entries"`
				} `json:"descriptors"`
			} `json:"global,omitempty"`
		} `json:"rateLimit,omitempty"`
	} `json:"spec"`
}

type gwv1Grant = gwv1b1.ReferenceGrant
