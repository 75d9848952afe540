package split_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/envoyrls/envoy-rls/internal/redistest"
	"github.com/envoyrls/envoy-rls/internal/testutil"
	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/backend"
	"github.com/envoyrls/envoy-rls/pkg/backend/memory"
	"github.com/envoyrls/envoy-rls/pkg/backend/redis"
	"github.com/envoyrls/envoy-rls/pkg/backend/split"
)

// decade is a window no test outlives: counts on Redis's own clock never
// reset during a test.
const decade = 10 * 365 * 24 * time.Hour

func lim(requests uint64) algorithms.Limit {
	return algorithms.Limit{Requests: requests, Window: decade}
}

// twoRedis starts two redis-servers and returns a split store on them
// (per-second keys by prefix "s/", or by window when route is nil), and
// the two Redis stores for direct checks.
func twoRedis(t *testing.T, route func(*backend.Item) bool, mainOpts, psOpts redis.Options, opts split.Options) (*split.Store, *redis.Store, *redis.Store, *redistest.Server, *redistest.Server) {
	t.Helper()
	mainSrv, psSrv := redistest.StartStandalone(t), redistest.StartStandalone(t)
	mainOpts.URL, psOpts.URL = mainSrv.URL(), psSrv.URL()
	main, err := redis.New(mainOpts)
	if err != nil {
		t.Fatal(err)
	}
	ps, err := redis.New(psOpts)
	if err != nil {
		t.Fatal(err)
	}
	opts.PerSecond = route
	s := split.New(main, ps, opts)
	t.Cleanup(func() { s.Close() })
	return s, main, ps, mainSrv, psSrv
}

// remaining reads a key's remaining hits with a check on store st.
func remaining(t *testing.T, st backend.Store, key string, l algorithms.Limit) uint64 {
	t.Helper()
	out := make([]algorithms.Decision, 1)
	if _, err := st.Apply(context.Background(), []backend.Item{{Key: key, Limit: l}}, out); err != nil {
		t.Fatalf("check %s: %v", key, err)
	}
	return out[0].Remaining
}

func keys(t *testing.T, srv *redistest.Server) string {
	t.Helper()
	ks, err := srv.Client().Keys(context.Background(), "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(ks, " ")
}

// With the default routing, a request with a per-second and a minute-long
// limit leaves the per-second counter on the per-second server only, the
// other on the main server only.
func TestRedisKeysLandByWindow(t *testing.T) {
	s, _, _, mainSrv, psSrv := twoRedis(t, nil, redis.Options{}, redis.Options{}, split.Options{})
	// A token bucket of 1 per second holding 1000: its state lives ~1000s,
	// long enough to be read back.
	perSec := algorithms.Limit{Algorithm: algorithms.TokenBucket, Requests: 1, Window: time.Second, Burst: 1000}
	out := make([]algorithms.Decision, 2)
	allowed, err := s.Apply(context.Background(), []backend.Item{
		{Key: "per_second_key", Limit: perSec, Hits: 1000},
		{Key: "per_minute_key", Limit: algorithms.Limit{Requests: 10, Window: time.Minute}, Hits: 1},
	}, out)
	if err != nil || !allowed {
		t.Fatalf("Apply: %v %v", allowed, err)
	}
	if out[0].Remaining != 0 || out[1].Remaining != 9 {
		t.Errorf("remaining %d and %d, want 0 and 9", out[0].Remaining, out[1].Remaining)
	}
	if k := keys(t, psSrv); !strings.Contains(k, "per_second_key") || strings.Contains(k, "per_minute_key") {
		t.Errorf("per-second server keys: %q", k)
	}
	if k := keys(t, mainSrv); !strings.Contains(k, "per_minute_key") || strings.Contains(k, "per_second_key") {
		t.Errorf("main server keys: %q", k)
	}
}

// A mixed request denied by either part charges neither, on real Redis.
func TestRedisMixedDenialChargesNothing(t *testing.T) {
	s, main, ps, _, _ := twoRedis(t, byPrefix, redis.Options{}, redis.Options{}, split.Options{})
	req := func(psLimit, mainLimit uint64) bool {
		out := make([]algorithms.Decision, 2)
		allowed, err := s.Apply(context.Background(), []backend.Item{
			{Key: "s/a", Limit: lim(psLimit), Hits: 1}, {Key: "m/a", Limit: lim(mainLimit), Hits: 1},
		}, out)
		if err != nil {
			t.Fatal(err)
		}
		return allowed
	}
	if !req(10, 1) {
		t.Fatal("first request denied")
	}
	// The main limit is used up: the per-second counter is not charged.
	for i := 0; i < 3; i++ {
		if req(10, 1) {
			t.Fatal("allowed past the main limit")
		}
	}
	if r := remaining(t, ps, "s/a", lim(10)); r != 9 {
		t.Errorf("per-second remaining %d, want 9 (charged by denied requests)", r)
	}
	// Now the per-second limit denies (1 of 1 used): the main counter of a
	// fresh pair is not charged.
	out := make([]algorithms.Decision, 2)
	allowed, err := s.Apply(context.Background(), []backend.Item{
		{Key: "s/a", Limit: lim(1), Hits: 1}, {Key: "m/b", Limit: lim(5), Hits: 1},
	}, out)
	if err != nil || allowed {
		t.Fatalf("Apply: %v %v, want denied", allowed, err)
	}
	if r := remaining(t, main, "m/b", lim(5)); r != 5 {
		t.Errorf("main remaining %d, want 5", r)
	}
	if st := s.Stats(); st.OverCharged != 0 || st.Mixed != 5 {
		t.Errorf("stats %+v, want 5 mixed and none over-charged", st)
	}
}

// Concurrent mixed requests never exceed either limit, and over-charge the
// per-second counter only for requests that raced the main counter
// filling up: at most once per caller, and exactly as counted.
func TestRedisConcurrentOverChargeBound(t *testing.T) {
	s, _, ps, _, _ := twoRedis(t, byPrefix, redis.Options{}, redis.Options{}, split.Options{})
	const callers, each, mainLimit = 8, 40, 50
	psLimit := lim(1 << 30)
	var allowed atomic.Int64
	var wg sync.WaitGroup
	for c := 0; c < callers; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out := make([]algorithms.Decision, 2)
			items := []backend.Item{{Key: "s/hot", Limit: psLimit, Hits: 1}, {Key: "m/hot", Limit: lim(mainLimit), Hits: 1}}
			for i := 0; i < each; i++ {
				ok, err := s.Apply(context.Background(), items, out)
				if err != nil {
					t.Error(err)
					return
				}
				if ok {
					allowed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if allowed.Load() != mainLimit {
		t.Fatalf("%d allowed, want exactly %d", allowed.Load(), mainLimit)
	}
	charged := psLimit.Requests - remaining(t, ps, "s/hot", psLimit)
	over := charged - mainLimit
	if st := s.Stats(); st.OverCharged != over {
		t.Errorf("per-second counter over-charged by %d, Stats.OverCharged %d", over, st.OverCharged)
	}
	if over > callers {
		t.Errorf("per-second counter over-charged by %d, more than one per caller (%d)", over, callers)
	}
	t.Logf("per-second over-charge: %d hits (bound %d)", over, callers)
}

// Each store follows its own failure mode: with the per-second Redis
// down, deny returns the error and charges the main part nothing; allow
// (the store counting failed-open hits, the split store continuing) still
// charges the main part and writes the per-second hits back once it is up;
// local decides the per-second part on its fallback and writes back too.
func TestRedisPerStoreFailureModes(t *testing.T) {
	items := func() []backend.Item {
		return []backend.Item{{Key: "s/f", Limit: lim(100), Hits: 1}, {Key: "m/f", Limit: lim(100), Hits: 1}}
	}
	t.Run("deny", func(t *testing.T) {
		s, main, _, _, psSrv := twoRedis(t, byPrefix, redis.Options{}, redis.Options{}, split.Options{})
		psSrv.Stop()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if _, err := s.Apply(ctx, items(), make([]algorithms.Decision, 2)); err == nil {
			t.Fatal("no error with the per-second Redis down")
		}
		if r := remaining(t, main, "m/f", lim(100)); r != 100 {
			t.Errorf("main remaining %d, want 100 (nothing charged)", r)
		}
	})
	t.Run("allow", func(t *testing.T) {
		s, main, ps, _, psSrv := twoRedis(t, byPrefix, redis.Options{}, redis.Options{CountFailedOpen: true}, split.Options{ContinueOnError: true})
		psSrv.Stop()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if _, err := s.Apply(ctx, items(), make([]algorithms.Decision, 2)); err == nil {
			t.Fatal("no error with the per-second Redis down")
		}
		if r := remaining(t, main, "m/f", lim(100)); r != 99 {
			t.Errorf("main remaining %d, want 99 (the failed-open request counted)", r)
		}
		psSrv.Restart()
		testutil.WaitFor(t, 10*time.Second, "the per-second hit written back", func() bool {
			// Until its PING answers, the store answers by the failure mode.
			return ps.Stats().NodesDown == 0 && remaining(t, ps, "s/f", lim(100)) == 99
		})
	})
	t.Run("local", func(t *testing.T) {
		fallback := memory.New()
		defer fallback.Close()
		s, main, ps, _, psSrv := twoRedis(t, byPrefix, redis.Options{}, redis.Options{Fallback: fallback}, split.Options{})
		psSrv.Stop()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if allowed, err := s.Apply(ctx, items(), make([]algorithms.Decision, 2)); err != nil || !allowed {
			t.Fatalf("Apply: %v %v, want allowed by the fallback", allowed, err)
		}
		if r := remaining(t, main, "m/f", lim(100)); r != 99 {
			t.Errorf("main remaining %d, want 99", r)
		}
		psSrv.Restart()
		testutil.WaitFor(t, 10*time.Second, "the per-second hit written back", func() bool {
			return remaining(t, ps, "s/f", lim(100)) == 99
		})
	})
}

// With the main Redis down, the peek of the main part fails first. Under
// allow the failed peek's hits are written back by the main store itself
// (once, not again by a second call) and the per-second part is charged;
// under local the main fallback decides the peek without keeping anything
// (it is denied by its blockers) and then the charge, which alone is
// written back.
func TestRedisMainDown(t *testing.T) {
	items := func() []backend.Item {
		return []backend.Item{{Key: "s/f", Limit: lim(100), Hits: 1}, {Key: "m/f", Limit: lim(100), Hits: 1}}
	}
	for _, mode := range []string{"allow", "local"} {
		t.Run(mode, func(t *testing.T) {
			mainOpts, opts := redis.Options{CountFailedOpen: true}, split.Options{ContinueOnError: true}
			if mode == "local" {
				fallback := memory.New()
				defer fallback.Close()
				mainOpts, opts = redis.Options{Fallback: fallback}, split.Options{}
			}
			s, main, ps, mainSrv, _ := twoRedis(t, byPrefix, mainOpts, redis.Options{}, opts)
			mainSrv.Stop()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			allowed, err := s.Apply(ctx, items(), make([]algorithms.Decision, 2))
			if mode == "allow" && err == nil {
				t.Fatal("no error with the main Redis down")
			}
			if mode == "local" && (err != nil || !allowed) {
				t.Fatalf("Apply: %v %v, want allowed by the fallback", allowed, err)
			}
			if r := remaining(t, ps, "s/f", lim(100)); r != 99 {
				t.Errorf("per-second remaining %d, want 99", r)
			}
			mainSrv.Restart()
			testutil.WaitFor(t, 10*time.Second, "the main store's write-backs done", func() bool {
				st := main.Stats()
				return st.WriteBackHits > 0 && st.WriteBackPending == 0
			})
			if st := main.Stats(); st.WriteBackHits != 1 {
				t.Errorf("%d hits written back to the main Redis, want 1", st.WriteBackHits)
			}
			if r := remaining(t, main, "m/f", lim(100)); r != 99 {
				t.Errorf("main remaining %d after the write-back, want 99 (the hit counted once)", r)
			}
		})
	}
}

// Ping checks both servers and names the one that does not answer.
func TestRedisPing(t *testing.T) {
	s, _, _, _, psSrv := twoRedis(t, byPrefix, redis.Options{}, redis.Options{}, split.Options{})
	if err := s.Ping(context.Background()); err != nil {
		t.Fatalf("Ping with both up: %v", err)
	}
	psSrv.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := s.Ping(ctx)
	if err == nil || !strings.Contains(err.Error(), "per-second") || strings.Contains(err.Error(), "main") {
		t.Fatalf("Ping with the per-second server down: %v, want an error naming it alone", err)
	}
}
