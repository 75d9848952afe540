package redis_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/envoyrls/envoy-rls/internal/redistest"
	"github.com/envoyrls/envoy-rls/internal/testutil"
	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/backend"
	"github.com/envoyrls/envoy-rls/pkg/backend/redis"
)

// TestServerLimitsReadOnConnect: the store reads maxmemory and
// maxmemory-policy when it connects, and again on a reconnect after they
// changed; an allkeys-* policy under a memory limit is flagged as one that
// evicts counters, noeviction is not.
func TestServerLimitsReadOnConnect(t *testing.T) {
	srv := redistest.StartStandalone(t)
	admin := srv.Client()
	ctx := context.Background()
	if err := admin.ConfigSet(ctx, "maxmemory", "64mb").Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin.ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err(); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var seen []redis.ServerLimits
	r := newRedisStore(t, redis.Options{URL: srv.URL(), OnServerLimits: func(l redis.ServerLimits) {
		mu.Lock()
		seen = append(seen, l)
		mu.Unlock()
	}})
	l := algorithms.Limit{Algorithm: algorithms.FixedWindow, Requests: 10, Window: time.Hour}
	apply := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := r.Apply(ctx, []backend.Item{{Key: "k", Limit: l, Hits: 1}}, make([]algorithms.Decision, 1))
		return err
	}
	if err := apply(); err != nil {
		t.Fatal(err)
	}
	got := r.ServerLimits()
	if len(got) != 1 || got[0].MaxMemory != 64<<20 || got[0].Policy != "allkeys-lru" || !got[0].EvictsCounters() || got[0].Addr != srv.Addr() {
		t.Fatalf("limits %+v, want 64 MiB allkeys-lru at %s, evicting counters", got, srv.Addr())
	}

	// The operator fixes the policy; the next connection (after a restart)
	// reports it.
	srv.Stop()
	srv.Restart()
	if err := srv.Client().ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatal(err)
	}
	if err := srv.Client().ConfigSet(ctx, "maxmemory", "64mb").Err(); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "a reconnect reports noeviction", func() bool {
		apply()
		got := r.ServerLimits()
		return len(got) == 1 && got[0].Policy == "noeviction"
	})
	if r.ServerLimits()[0].EvictsCounters() {
		t.Error("noeviction flagged as evicting counters")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) < 2 || seen[0].Policy != "allkeys-lru" || seen[len(seen)-1].Policy != "noeviction" {
		t.Errorf("OnServerLimits calls %+v, want allkeys-lru then noeviction", seen)
	}
}

// TestOOMCountedApart: a Redis at maxmemory with noeviction refuses the
// script's writes; the call fails (the failure mode decides) and the
// refusal is counted as OOM.
func TestOOMCountedApart(t *testing.T) {
	srv := redistest.StartStandalone(t)
	admin := srv.Client()
	ctx := context.Background()
	for _, kv := range [][2]string{{"maxmemory-policy", "noeviction"}, {"maxmemory", "1"}} {
		if err := admin.ConfigSet(ctx, kv[0], kv[1]).Err(); err != nil {
			t.Fatal(err)
		}
	}
	r := newRedisStore(t, redis.Options{URL: srv.URL()})
	l := algorithms.Limit{Algorithm: algorithms.FixedWindow, Requests: 10, Window: time.Hour}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := r.Apply(cctx, []backend.Item{{Key: "k", Limit: l, Hits: 1}}, make([]algorithms.Decision, 1))
	if err == nil || !strings.Contains(err.Error(), "OOM") {
		t.Fatalf("Apply at maxmemory: %v, want an OOM error", err)
	}
	if st := r.Stats(); st.OOM != 1 || st.Errors != 1 {
		t.Errorf("stats %+v, want 1 OOM among 1 error", st)
	}
}
