package rls_test

import (
	"math"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/envoyrls/envoy-rls/pkg/rls"
)

// Failing open keeps what is known without the store: an unlimited
// descriptor still reports the most a uint32 holds, as when the store works.
func TestFailOpenKeepsUnlimitedStatus(t *testing.T) {
	h := start(t, featuresYAML, rls.Options{FailureMode: rls.FailOpen})
	h.store.Close()
	r := h.call(t, "f", desc("vip", "a"), desc("small", "a"))
	if r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("fail open: %v", r)
	}
	if got := r.Statuses[0].LimitRemaining; got != math.MaxUint32 || r.Statuses[0].CurrentLimit != nil {
		t.Fatalf("unlimited while failing open: %v", r.Statuses[0])
	}
	if r.Statuses[1].CurrentLimit == nil {
		t.Fatalf("limited descriptor lost its current_limit: %v", r.Statuses[1])
	}
}
