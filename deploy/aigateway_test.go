package deploy_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"reflect"
	"strings"
	"testing"
	"time"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
	"gopkg.in/yaml.v3"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// Envoy AI Gateway's API module (github.com/envoyproxy/ai-gateway) is not
// served by the Go module proxy this project uses, so its two kinds are
// checked against the schema below, written after its api/v1alpha1 (the
// fields the example uses and their neighbours); strict decoding refuses
// any other field.

// aigwRoute is an AIGatewayRoute (aigateway.envoyproxy.io/v1alpha1).
type aigwRoute struct {
	APIVersion string  `json:"apiVersion"`
	Kind       string  `json:"kind"`
	Metadata   kgwMeta `json:"metadata"`
	Spec       struct {
		ParentRefs []gwv1.ParentReference `json:"parentRefs,omitempty"`
		Rules      []struct {
			Matches []struct {
				Headers []gwv1.HTTPHeaderMatch `json:"headers,omitempty"`
			} `json:"matches,omitempty"`
			BackendRefs []struct {
				Name              string  `json:"name"`
				Namespace         *string `json:"namespace,omitempty"`
				Group             *string `json:"group,omitempty"`
				Kind              *string `json:"kind,omitempty"`
				ModelNameOverride string  `json:"modelNameOverride,omitempty"`
				Weight            *int32  `json:"weight,omitempty"`
				Priority          *uint32 `json:"priority,omitempty"`
			} `json:"backendRefs,omitempty"`
			Timeouts *gwv1.HTTPRouteTimeouts `json:"timeouts,omitempty"`
		} `json:"rules"`
		LLMRequestCosts []struct {
			MetadataKey string  `json:"metadataKey"`
			Type        string  `json:"type"` // InputToken, CachedInputToken, OutputToken, TotalToken, CEL
			CEL         *string `json:"cel,omitempty"`
		} `json:"llmRequestCosts,omitempty"`
	} `json:"spec"`
}

// aigwServiceBackend is an AIServiceBackend (aigateway.envoyproxy.io/v1alpha1).
type aigwServiceBackend struct {
	APIVersion string  `json:"apiVersion"`
	Kind       string  `json:"kind"`
	Metadata   kgwMeta `json:"metadata"`
	Spec       struct {
		Schema struct {
			Name    string `json:"name"`
			Version string `json:"version,omitempty"`
		} `json:"schema"`
		BackendRef gwv1.BackendObjectReference `json:"backendRef"`
	} `json:"spec"`
}

// aigwMetadataNamespace is where the AI Gateway filter writes the costs.
const aigwMetadataNamespace = "io.envoy.ai_gateway"

// rlsConfig is a descriptor config in the reference server's format.
type rlsConfig struct {
	Domain      string    `yaml:"domain"`
	Descriptors []rlsDesc `yaml:"descriptors"`
}

type rlsDesc struct {
	Key         string    `yaml:"key"`
	Value       string    `yaml:"value,omitempty"`
	RateLimit   *rlsLimit `yaml:"rate_limit,omitempty"`
	Descriptors []rlsDesc `yaml:"descriptors,omitempty"`
}

type rlsLimit struct {
	Unit            string `yaml:"unit"`
	RequestsPerUnit uint32 `yaml:"requests_per_unit"`
}

// renderEG renders the descriptors of a BackendTrafficPolicy's global rules
// on one route rule as Envoy Gateway does (internal/xds/translator,
// buildRateLimitServiceDescriptors, for a policy that is not shared): the
// route's IR name as key and value, then per rule a chain of its header
// selectors (rule-R-match-M; Distinct ones without a value), the limit on
// the last. Only header selectors, which the example uses, are rendered.
func renderEG(t *testing.T, domain, route string, rules []egv1a1.RateLimitRule) rlsConfig {
	t.Helper()
	top := rlsDesc{Key: route, Value: route}
	for r, rule := range rules {
		var chain []rlsDesc
		m := 0
		for _, sel := range rule.ClientSelectors {
			if sel.Methods != nil || sel.Path != nil || sel.SourceCIDR != nil || len(sel.QueryParams) > 0 {
				t.Fatalf("rule %d: renderEG renders header selectors only", r)
			}
			for _, h := range sel.Headers {
				d := rlsDesc{Key: fmt.Sprintf("rule-%d-match-%d", r, m)}
				if h.Type == nil || *h.Type != egv1a1.HeaderMatchDistinct {
					d.Value = d.Key
				}
				chain = append(chain, d)
				m++
			}
		}
		if len(chain) == 0 {
			t.Fatalf("rule %d has no header selector", r)
		}
		chain[len(chain)-1].RateLimit = &rlsLimit{Unit: strings.ToUpper(string(rule.Limit.Unit)), RequestsPerUnit: rule.Limit.Requests}
		for i := len(chain) - 1; i > 0; i-- {
			chain[i-1].Descriptors = []rlsDesc{chain[i]}
		}
		top.Descriptors = append(top.Descriptors, chain[0])
	}
	return rlsConfig{Domain: domain, Descriptors: []rlsDesc{top}}
}

// TestEnvoyAIGatewayExample checks deploy/envoy-ai-gateway/token-budgets.yaml
// (the Gateway, the AIGatewayRoute with its llmRequestCosts, the
// BackendTrafficPolicy with input, output and total token budgets per user
// and model), that examples/token-budgets.yaml is what Envoy Gateway renders
// for it, and that envoy-rls keeps those budgets with Envoy's two calls per
// request on it.
func TestEnvoyAIGatewayExample(t *testing.T) {
	objs := loadManifests(t, "deploy/envoy-ai-gateway/token-budgets.yaml")
	gw := only[*gwv1.Gateway](t, objs)
	route := only[*aigwRoute](t, objs)
	svc := only[*aigwServiceBackend](t, objs)
	backend := only[*egv1a1.Backend](t, objs)
	btp := only[*egv1a1.BackendTrafficPolicy](t, objs)

	if len(route.Spec.ParentRefs) != 1 || string(route.Spec.ParentRefs[0].Name) != gw.Name ||
		route.Spec.ParentRefs[0].Kind == nil || *route.Spec.ParentRefs[0].Kind != "Gateway" {
		t.Errorf("the AIGatewayRoute is not attached to the Gateway")
	}
	if len(route.Spec.Rules) != 1 || len(route.Spec.Rules[0].BackendRefs) != 1 || route.Spec.Rules[0].BackendRefs[0].Name != svc.Metadata.Name {
		t.Errorf("the AIGatewayRoute's rule does not route to the AIServiceBackend")
	}
	if svc.Spec.BackendRef.Kind == nil || *svc.Spec.BackendRef.Kind != "Backend" || string(svc.Spec.BackendRef.Name) != backend.Name {
		t.Errorf("the AIServiceBackend does not reference the Backend")
	}
	// Envoy Gateway turns the AIGatewayRoute into an HTTPRoute of the same
	// name, which the policy targets.
	if len(btp.Spec.TargetRefs) != 1 || btp.Spec.TargetRefs[0].Kind != "HTTPRoute" || string(btp.Spec.TargetRefs[0].Name) != route.Metadata.Name {
		t.Errorf("the BackendTrafficPolicy does not target the HTTPRoute generated for the AIGatewayRoute")
	}
	costs := map[string]string{} // metadata key -> type
	for _, c := range route.Spec.LLMRequestCosts {
		costs[c.MetadataKey] = c.Type
	}
	rules := btp.Spec.RateLimit.Global.Rules
	budgets := map[string]uint32{} // cost type -> tokens a day
	for i, r := range rules {
		var headers []string
		for _, sel := range r.ClientSelectors {
			for _, h := range sel.Headers {
				if h.Type == nil || *h.Type != egv1a1.HeaderMatchDistinct {
					t.Errorf("rule %d: header %s is not Distinct (a budget per value)", i, h.Name)
				}
				headers = append(headers, h.Name)
			}
		}
		if strings.Join(headers, ",") != "x-user-id,x-ai-eg-model" {
			t.Errorf("rule %d selects %v, want a budget per user and model", i, headers)
		}
		c := r.Cost
		if c == nil || c.Request == nil || c.Request.From != egv1a1.RateLimitCostFromNumber || c.Request.Number == nil || *c.Request.Number != 0 {
			t.Errorf("rule %d: want cost.request Number 0 (check on the request path, charge nothing)", i)
			continue
		}
		if c.Response == nil || c.Response.From != egv1a1.RateLimitCostFromMetadata || c.Response.Metadata == nil || c.Response.Metadata.Namespace != aigwMetadataNamespace {
			t.Errorf("rule %d: want cost.response from AI Gateway's metadata (%s)", i, aigwMetadataNamespace)
			continue
		}
		typ, ok := costs[c.Response.Metadata.Key]
		if !ok {
			t.Errorf("rule %d charges %s, which no llmRequestCost writes", i, c.Response.Metadata.Key)
		}
		budgets[typ] = r.Limit.Requests
		if r.Limit.Unit != egv1a1.RateLimitUnitDay {
			t.Errorf("rule %d: a daily budget is meant", i)
		}
	}
	for _, typ := range []string{"InputToken", "OutputToken", "TotalToken"} {
		if budgets[typ] == 0 {
			t.Errorf("no budget of %s", typ)
		}
	}

	// The descriptor config: the listener's name as domain, the route rule
	// generated for the AIGatewayRoute's first rule and match.
	domain := btp.Namespace + "/" + gw.Name + "/" + string(gw.Spec.Listeners[0].Name)
	irRoute := fmt.Sprintf("httproute/%s/%s/rule/0/match/0/*", route.Metadata.Namespace, route.Metadata.Name)
	want := renderEG(t, domain, irRoute, rules)
	var got rlsConfig
	dec := yaml.NewDecoder(bytes.NewReader(readRepoFile(t, "examples/token-budgets.yaml")))
	dec.KnownFields(true)
	if err := dec.Decode(&got); err != nil {
		t.Fatalf("examples/token-budgets.yaml: %v", err)
	}
	if !reflect.DeepEqual(got, want) {
		g, _ := yaml.Marshal(got)
		w, _ := yaml.Marshal(want)
		t.Fatalf("examples/token-budgets.yaml is not what Envoy Gateway renders:\n%s\nwant:\n%s", g, w)
	}
	if testing.Short() {
		return
	}

	// envoy-rls keeps the budgets: a check (hits_addend 0) on the request
	// path, the response's token counts as hits_addend when it is done.
	path := repoPath("examples/token-budgets.yaml")
	checkConfig(t, path)
	httpAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	p := start(t, exec.Command(envoyRLS(t), "serve", "--config", path,
		fmt.Sprintf("--grpc-addr=127.0.0.1:%d", freePort(t)), "--http-addr="+httpAddr))
	p.waitHTTP(t, "http://"+httpAddr+"/healthz")
	call := func(user string, hits [3]uint64) (int, []string) {
		t.Helper()
		var ds []any
		for r, h := range hits {
			ds = append(ds, map[string]any{"entries": []map[string]string{
				{"key": irRoute, "value": irRoute},
				{"key": fmt.Sprintf("rule-%d-match-0", r), "value": user},
				{"key": fmt.Sprintf("rule-%d-match-1", r), "value": "gpt-4o-mini"},
			}, "hits_addend": h})
		}
		return postStatuses(t, httpAddr, map[string]any{"domain": domain, "descriptors": ds})
	}
	check := [3]uint64{}
	if code, st := call("alice", check); code != http.StatusOK {
		t.Fatalf("first check: %d %v", code, st)
	}
	// A response of 40,000 input and 25,000 output tokens: the output and
	// total budgets are spent past their limits, and counted.
	call("alice", [3]uint64{40000, 25000, 65000})
	code, st := call("alice", check)
	if code != http.StatusTooManyRequests || strings.Join(st, ",") != "OK,OVER_LIMIT,OVER_LIMIT" {
		t.Fatalf("check after the output budget is spent: %d %v, want 429 with OK,OVER_LIMIT,OVER_LIMIT", code, st)
	}
	if code, st := call("bob", check); code != http.StatusOK {
		t.Fatalf("another user's check: %d %v", code, st)
	}
}

// postStatuses sends a RateLimitRequest in JSON to POST /json and returns
// the HTTP status and each descriptor's code.
func postStatuses(t *testing.T, httpAddr string, req map[string]any) (int, []string) {
	t.Helper()
	body, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+httpAddr+"/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out struct {
		Statuses []struct {
			Code string `json:"code"`
		} `json:"statuses"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("POST /json answer %s: %v", raw, err)
	}
	var codes []string
	for _, s := range out.Statuses {
		codes = append(codes, s.Code)
	}
	return resp.StatusCode, codes
}
