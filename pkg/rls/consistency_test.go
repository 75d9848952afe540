package rls_test

import (
	"sync"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/envoyrls/envoy-rls/pkg/backend"
	"github.com/envoyrls/envoy-rls/pkg/descriptors"
	"github.com/envoyrls/envoy-rls/pkg/rls"
)

const consistencyYAML = `
domain: c
default_consistency: approximate
descriptors:
  - key: file
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: own
    rate_limit: {unit: hour, requests_per_unit: 10, consistency: lease}
  - key: log
    rate_limit: {unit: hour, requests_per_unit: 10, algorithm: sliding_window_log}
---
domain: d
descriptors:
  - key: plain
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: own
    rate_limit: {unit: hour, requests_per_unit: 10, consistency: strict}
`

// TestConsistencyReachesTheStore: every item the store gets carries its
// limit's consistency: its own, its file's default, else the service's;
// a sliding_window_log is strict whatever the defaults; a request's limit
// override is strict.
func TestConsistencyReachesTheStore(t *testing.T) {
	var mu sync.Mutex
	var got []backend.Consistency
	obs := rls.ObserverFunc(func(e *rls.DecisionEvent) {
		mu.Lock()
		defer mu.Unlock()
		for _, l := range e.Limits {
			got = append(got, l.Consistency)
		}
	})
	for _, tc := range []struct {
		def    descriptors.Consistency
		domain string
		d      *commonv3.RateLimitDescriptor
		want   backend.Consistency
	}{
		{descriptors.ConsistencyLease, "c", desc("file", "x"), backend.Approximate},
		{descriptors.ConsistencyStrict, "c", desc("own", "x"), backend.Lease},
		{descriptors.ConsistencyLease, "c", desc("log", "x"), backend.Strict},
		{descriptors.ConsistencyLease, "d", desc("plain", "x"), backend.Lease},
		{descriptors.ConsistencyApproximate, "d", desc("plain", "x"), backend.Approximate},
		{descriptors.ConsistencyUnset, "d", desc("plain", "x"), backend.Strict},
		{descriptors.ConsistencyLease, "d", desc("own", "x"), backend.Strict},
		{descriptors.ConsistencyLease, "d", override(desc("plain", "x")), backend.Strict},
		{descriptors.ConsistencyStrict, "c", override(desc("own", "x")), backend.Strict},
	} {
		mu.Lock()
		got = nil
		mu.Unlock()
		h := start(t, consistencyYAML, rls.Options{Consistency: tc.def, Observers: []rls.Observer{obs}})
		h.call(t, tc.domain, tc.d)
		h.svc.Close() // the observer has every event
		mu.Lock()
		if len(got) != 1 || got[0] != tc.want {
			t.Errorf("default %v, %s %v: store got %v, want [%v]", tc.def, tc.domain, tc.d.Entries, got, tc.want)
		}
		mu.Unlock()
	}
}

func override(d *commonv3.RateLimitDescriptor) *commonv3.RateLimitDescriptor {
	d.Limit = &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 3, Unit: typev3.RateLimitUnit_HOUR}
	return d
}
