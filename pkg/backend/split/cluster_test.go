package split_test

import (
	"context"
	"testing"

	"github.com/envoyrls/envoy-rls/internal/redistest"
	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/backend"
	"github.com/envoyrls/envoy-rls/pkg/backend/redis"
	"github.com/envoyrls/envoy-rls/pkg/backend/split"
)

// On a Redis Cluster main store, a request's main part spread over several
// partitions (hash slots, decided by one script call each) is peeked
// without charging any of them: each partition gets its own blocker.
func TestClusterPeekChargesNoPartition(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	psSrv := redistest.StartStandalone(t)
	main, err := redis.New(redis.Options{ClusterAddrs: cluster.Addrs()})
	if err != nil {
		t.Fatal(err)
	}
	ps, err := redis.New(redis.Options{URL: psSrv.URL()})
	if err != nil {
		t.Fatal(err)
	}
	s := split.New(main, ps, split.Options{PerSecond: byPrefix})
	defer s.Close()
	mainItems := []backend.Item{
		{Key: "m/x", Limit: lim(5), Hits: 1, Partition: 1},
		{Key: "m/y", Limit: lim(5), Hits: 1, Partition: 2},
		{Key: "m/z", Limit: lim(5), Hits: 1, Partition: 3},
		{Key: "m/w", Limit: lim(5), Hits: 1}, // placed by its key
	}
	out := make([]algorithms.Decision, 5)
	// The per-second limit is used up by the first request: the second is
	// denied after its main part was peeked.
	for i, want := range []bool{true, false, false} {
		allowed, err := s.Apply(context.Background(), append([]backend.Item{{Key: "s/a", Limit: lim(1), Hits: 1}}, mainItems...), out)
		if err != nil || allowed != want {
			t.Fatalf("request %d: %v %v, want %v", i, allowed, err, want)
		}
	}
	for _, it := range mainItems {
		check := it
		check.Hits = 0
		d := make([]algorithms.Decision, 1)
		if _, err := main.Apply(context.Background(), []backend.Item{check}, d); err != nil {
			t.Fatal(err)
		}
		if d[0].Remaining != 4 {
			t.Errorf("%s (partition %d): remaining %d, want 4 (charged by the allowed request only)", it.Key, it.Partition, d[0].Remaining)
		}
	}
	if st := s.Stats(); st.Peeks != 3 {
		t.Errorf("%d peeks, want 3", st.Peeks)
	}
}
