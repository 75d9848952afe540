package rls_test

import (
	"context"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/envoyrls/envoy-rls/pkg/backend/memory"
	"github.com/envoyrls/envoy-rls/pkg/descriptors"
	"github.com/envoyrls/envoy-rls/pkg/rls"
)

// FuzzShouldRateLimit sends arbitrary requests (as protojson, the /json
// format) to the service over the feature config: it must never panic, and
// it answers either a response with one status per descriptor or
// InvalidArgument.
func FuzzShouldRateLimit(f *testing.F) {
	for _, seed := range []string{
		`{"domain":"f","descriptors":[{"entries":[{"key":"api","value":"k"}]}]}`,
		`{"domain":"f","hitsAddend":3,"descriptors":[{"entries":[{"key":"bucket","value":"img-1"}]},{"entries":[{"key":"q1","value":"x"}]}]}`,
		`{"domain":"f","descriptors":[{"entries":[{"key":"small","value":"o"}],"limit":{"requestsPerUnit":2,"unit":"HOUR","unitMultiplier":7}}]}`,
		`{"domain":"f","descriptors":[{"entries":[{"key":"login","value":"u"}]},{"entries":[{"key":"trusted","value":"u"}],"hitsAddend":"0"}]}`,
		`{"domain":"f","descriptors":[{"entries":[{"key":"vip","value":""}],"isNegativeHits":true}]}`,
		`{"domain":"","descriptors":[]}`,
	} {
		f.Add([]byte(seed))
	}
	cfg, err := descriptors.Parse("f.yaml", []byte(featuresYAML))
	if err != nil {
		f.Fatal(err)
	}
	store := memory.New()
	f.Cleanup(func() { store.Close() })
	svc := rls.New(store, cfg, rls.Options{ResponseHeaders: rls.HeadersAll})
	f.Fuzz(func(t *testing.T, data []byte) {
		var req rlsv3.RateLimitRequest
		if protojson.Unmarshal(data, &req) != nil {
			return
		}
		resp, err := svc.ShouldRateLimit(context.Background(), &req)
		if err != nil {
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("error %v, want InvalidArgument", err)
			}
			return
		}
		if len(resp.Statuses) != len(req.Descriptors) {
			t.Fatalf("%d statuses for %d descriptors", len(resp.Statuses), len(req.Descriptors))
		}
	})
}
