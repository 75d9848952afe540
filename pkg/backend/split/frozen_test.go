package split_test

import (
	"context"
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

// frozenPair starts the split store of two Redis stores under failure mode
// mode ("local": each with its own fallback; "allow": counting failed-open
// hits, the split store continuing), with read timeouts long enough that
// every call sent to a frozen server gets its late reply after Resume (so
// the counts are exact). It returns the server frozen by the test.
func frozenPair(t *testing.T, mode string, freeze string) (*split.Store, *redis.Store, *redis.Store, *redistest.Server) {
	t.Helper()
	base := redis.Options{ReadTimeout: time.Minute, WriteTimeout: time.Minute}
	mainOpts, psOpts, opts := base, base, split.Options{}
	switch mode {
	case "local":
		mainFB, psFB := memory.New(), memory.New()
		t.Cleanup(func() { mainFB.Close(); psFB.Close() })
		mainOpts.Fallback, psOpts.Fallback = mainFB, psFB
	case "allow":
		mainOpts.CountFailedOpen, psOpts.CountFailedOpen = true, true
		opts.ContinueOnError = true
	}
	s, main, ps, mainSrv, psSrv := twoRedis(t, byPrefix, mainOpts, psOpts, opts)
	frozen := psSrv
	if freeze == "main" {
		frozen = mainSrv
	}
	frozen.Pause()
	t.Cleanup(frozen.Resume)
	return s, main, ps, frozen
}

// counted waits until st takes Redis for answering and Redis counts want
// hits on key of store st (the late replies and write-backs after a
// freeze), then checks that nothing more
// comes once every write-back is sent.
func counted(t *testing.T, st *redis.Store, key string, l algorithms.Limit, want uint64) {
	t.Helper()
	// A store that found the frozen server down answers by the failure
	// mode until its next PING does.
	testutil.WaitFor(t, 20*time.Second, "Redis answering again", func() bool { return st.Stats().NodesDown == 0 })
	testutil.WaitFor(t, 20*time.Second, key+" counted", func() bool {
		return l.Requests-remaining(t, st, key, l) >= want && st.Stats().WriteBackPending == 0
	})
	if got := l.Requests - remaining(t, st, key, l); got != want {
		t.Errorf("%s: Redis counted %d hits, want %d", key, got, want)
	}
}

// F1: under failure mode local, a mixed request with one Redis frozen is
// decided (the frozen part on its fallback), never failed: before, the
// frozen part spent the whole budget and the other part was called with no
// time left and failed (UNAVAILABLE). Each part now gets its share of the
// budget: with the per-second Redis frozen, the healthy main Redis still
// decides the main part. Every allowed hit is counted in both Redis
// deployments once they answer again. The budget is the context's
// deadline (Apply) or ApplyBy's, which the parts share the same way.
func TestFrozenRedisDecidedLocally(t *testing.T) {
	l := lim(1 << 20)
	for _, tc := range []struct {
		freeze  string
		calls   int
		budget  time.Duration
		applyBy bool
	}{
		{"persecond", 3, 2 * time.Second, false}, {"main", 3, time.Second, false},
		{"persecond", 3, 2 * time.Second, true}, {"main", 3, time.Second, true},
	} {
		name := tc.freeze + " frozen"
		if tc.applyBy {
			name += ", ApplyBy"
		}
		t.Run(name, func(t *testing.T) {
			s, main, ps, frozen := frozenPair(t, "local", tc.freeze)
			for i := 0; i < tc.calls; i++ {
				items := []backend.Item{{Key: "s/k", Limit: l, Hits: 1}, {Key: "m/k", Limit: l, Hits: 1}}
				var allowed bool
				var err error
				if tc.applyBy {
					allowed, err = s.ApplyBy(context.Background(), time.Now().Add(tc.budget), items, make([]algorithms.Decision, 2))
				} else {
					ctx, cancel := context.WithTimeout(context.Background(), tc.budget)
					allowed, err = s.Apply(ctx, items, make([]algorithms.Decision, 2))
					cancel()
				}
				if err != nil || !allowed {
					t.Fatalf("call %d: %v %v, want allowed (decided locally where Redis is frozen)", i, allowed, err)
				}
			}
			if tc.freeze == "persecond" {
				// The main part had a quarter of the budget (0.5 s) left
				// after the per-second part's share: a healthy Redis
				// answers in it.
				if st := main.Stats(); st.LocalFallbacks != 0 {
					t.Errorf("main Redis (healthy) left %d calls to its fallback: %+v", st.LocalFallbacks, st)
				}
				if st := ps.Stats(); st.LocalFallbacks != uint64(tc.calls) {
					t.Errorf("per-second fallback decided %d calls, want %d", st.LocalFallbacks, tc.calls)
				}
			}
			frozen.Resume()
			counted(t, ps, "s/k", l, uint64(tc.calls))
			counted(t, main, "m/k", l, uint64(tc.calls))
		})
	}
}

// F6: under failure mode allow, every call is answered OK (allowed, or
// failed open), and after the freeze both Redis deployments have counted
// every one of them, exactly: before, a part called with its budget spent
// returned at once without writing its hits back.
func TestFrozenRedisAllowCountsEveryOK(t *testing.T) {
	l := lim(1 << 20)
	for _, freeze := range []string{"persecond", "main"} {
		t.Run(freeze+" frozen", func(t *testing.T) {
			s, main, ps, frozen := frozenPair(t, "allow", freeze)
			const callers, each = 8, 6
			var ok, denied atomic.Int64
			var wg sync.WaitGroup
			for c := 0; c < callers; c++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < each; i++ {
						ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
						allowed, err := s.Apply(ctx, []backend.Item{{Key: "s/k", Limit: l, Hits: 1}, {Key: "m/k", Limit: l, Hits: 1}}, make([]algorithms.Decision, 2))
						cancel()
						if err != nil || allowed { // an error is answered OK (fail open)
							ok.Add(1)
						} else {
							denied.Add(1)
						}
					}
				}()
			}
			wg.Wait()
			if denied.Load() != 0 {
				t.Fatalf("%d calls denied", denied.Load())
			}
			frozen.Resume()
			counted(t, ps, "s/k", l, uint64(ok.Load()))
			counted(t, main, "m/k", l, uint64(ok.Load()))
		})
	}
}
