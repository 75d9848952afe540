package rls

import (
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
)

// TestJSONKeepsZeroRemaining checks that /json's encoding has limitRemaining
// in every status, 0 included, and changes nothing else: not the response
// (the zeros are restored), not a name or metadata that spells the key.
func TestJSONKeepsZeroRemaining(t *testing.T) {
	meta, err := structpb.NewStruct(map[string]any{"limitRemaining": 1.0, "x": map[string]any{"limitRemaining": 1.0}})
	if err != nil {
		t.Fatal(err)
	}
	resp := &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
			{Code: rlsv3.RateLimitResponse_OVER_LIMIT, CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{Name: `"limitRemaining":1`, RequestsPerUnit: 5, Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE}, DurationUntilReset: durationpb.New(3e9)},
			{Code: rlsv3.RateLimitResponse_OK, CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: 10, Unit: rlsv3.RateLimitResponse_RateLimit_SECOND}, LimitRemaining: 1, DurationUntilReset: durationpb.New(1e9)},
			{Code: rlsv3.RateLimitResponse_OK}, // matched no rule
			{Code: rlsv3.RateLimitResponse_OK, LimitRemaining: 4294967295},
			{Code: rlsv3.RateLimitResponse_OK, LimitRemaining: 10},
		},
		DynamicMetadata: meta,
	}
	before := proto.Clone(resp)
	out, err := marshalResponse(resp)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"overallCode":"OVER_LIMIT","statuses":[` +
		`{"code":"OVER_LIMIT","currentLimit":{"name":"\"limitRemaining\":1","requestsPerUnit":5,"unit":"MINUTE"},"limitRemaining":0,"durationUntilReset":"3s"},` +
		`{"code":"OK","currentLimit":{"requestsPerUnit":10,"unit":"SECOND"},"limitRemaining":1,"durationUntilReset":"1s"},` +
		`{"code":"OK","limitRemaining":0},` +
		`{"code":"OK","limitRemaining":4294967295},` +
		`{"code":"OK","limitRemaining":10}],` +
		`"dynamicMetadata":{"limitRemaining":1,"x":{"limitRemaining":1}}}` + "\n"
	if string(out) != want {
		t.Fatalf("got  %s\nwant %s", out, want)
	}
	if !proto.Equal(resp, before) {
		t.Fatalf("the response changed: %v", resp)
	}
	var back rlsv3.RateLimitResponse
	if err := protojson.Unmarshal(out, &back); err != nil || !proto.Equal(&back, resp) {
		t.Fatalf("does not decode to the response: %v %v", err, &back)
	}
	if n := strings.Count(string(out), `"limitRemaining":`); n != 7 {
		t.Fatalf("%d limitRemaining keys", n)
	}
}
