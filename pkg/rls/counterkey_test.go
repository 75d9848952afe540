package rls

import (
	"context"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/backend"
	"github.com/envoyrls/envoy-rls/pkg/backend/memory"
	"github.com/envoyrls/envoy-rls/pkg/descriptors"
)

// keyStore decides with a real memory store and records the keys and
// partitions of the items it is given.
type keyStore struct {
	m     *memory.Store
	items []backend.Item
}

func (k *keyStore) Apply(ctx context.Context, items []backend.Item, out []algorithms.Decision) (bool, error) {
	k.items = append(k.items, items...)
	return k.m.Apply(ctx, items, out)
}

func (k *keyStore) Close() error { return k.m.Close() }

// TestCounterKeyIsTheKeyRLSCharges: CounterKey gives the key and partition
// a ShouldRateLimit call charges for the same entries, share_threshold's
// shared counter included, so the RLQS service can share RLS's counters.
func TestCounterKeyIsTheKeyRLSCharges(t *testing.T) {
	cfg, err := descriptors.Parse("t.yaml", []byte(`
domain: d
descriptors:
  - key: tenant
    descriptors:
      - key: path
        value: "/api/*"
        share_threshold: true
        rate_limits:
          - {unit: second, requests_per_unit: 10}
          - {unit: hour, requests_per_unit: 1000}
`))
	if err != nil {
		t.Fatal(err)
	}
	ks := &keyStore{m: memory.New()}
	defer ks.Close()
	svc := New(ks, cfg, Options{})
	entries := []descriptors.Entry{{Key: "tenant", Value: "a"}, {Key: "path", Value: "/api/x"}}
	req := &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*commonv3.RateLimitDescriptor{{Entries: []*commonv3.RateLimitDescriptor_Entry{
		{Key: "tenant", Value: "a"}, {Key: "path", Value: "/api/x"},
	}}}}
	if _, err := svc.ShouldRateLimit(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	path := cfg.Domain("d").Match(entries, nil)
	limits := path[len(path)-1].Limits
	if len(ks.items) != len(limits) {
		t.Fatalf("%d items for %d limits", len(ks.items), len(limits))
	}
	for i, l := range limits {
		key, part := CounterKey("d", entries, path, l.ID)
		if key != ks.items[i].Key || part != ks.items[i].Partition {
			t.Errorf("limit %d: CounterKey %q/%d, RLS charged %q/%d", i, key, part, ks.items[i].Key, ks.items[i].Partition)
		}
	}
	// Another value under the shared wildcard: the same counter.
	other := []descriptors.Entry{{Key: "tenant", Value: "a"}, {Key: "path", Value: "/api/y"}}
	if k1, _ := CounterKey("d", entries, path, limits[0].ID); k1 != func() string {
		k, _ := CounterKey("d", other, cfg.Domain("d").Match(other, nil), limits[0].ID)
		return k
	}() {
		t.Error("share_threshold values got different counters")
	}
}
