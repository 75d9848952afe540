package redis_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/envoyrls/envoy-rls/internal/redistest"
	"github.com/envoyrls/envoy-rls/internal/testutil"
	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/backend"
	"github.com/envoyrls/envoy-rls/pkg/backend/memory"
	"github.com/envoyrls/envoy-rls/pkg/backend/redis"
)

// A call whose time is up before it starts (a split request's later part
// after an earlier part spent the budget, or a caller that left) is not
// sent, and the failure mode decides it all the same: local decides on the
// fallback and writes the hit back, allow writes it back (the caller
// answers OK), deny fails it and charges nothing. Before, Apply returned
// ctx.Err() at once: UNAVAILABLE under local, and an OK never counted under
// allow.
func TestSpentBudgetFollowsTheFailureMode(t *testing.T) {
	l := algorithms.Limit{Algorithm: algorithms.FixedWindow, Requests: 100, Window: time.Hour}
	expired, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Millisecond))
	defer cancel()
	cancelled, cancel2 := context.WithCancel(context.Background())
	cancel2()
	for _, mode := range []string{"local", "allow", "deny"} {
		t.Run(mode, func(t *testing.T) {
			srv := redistest.StartStandalone(t)
			opts := redis.Options{URL: srv.URL()}
			switch mode {
			case "local":
				fb := memory.New()
				defer fb.Close()
				opts.Fallback = fb
			case "allow":
				opts.CountFailedOpen = true
			}
			r := newRedisStore(t, opts)
			for _, ctx := range []context.Context{expired, cancelled} {
				allowed, err := r.Apply(ctx, []backend.Item{{Key: "k", Limit: l, Hits: 1}}, make([]algorithms.Decision, 1))
				switch mode {
				case "local":
					if err != nil || !allowed {
						t.Fatalf("Apply: %v %v, want allowed by the fallback", allowed, err)
					}
				default:
					if err == nil || !errors.Is(err, ctx.Err()) {
						t.Fatalf("Apply: %v, want an error wrapping %v", err, ctx.Err())
					}
				}
			}
			want := uint64(2)
			if mode == "deny" {
				want = 0
			}
			testutil.WaitFor(t, 10*time.Second, "write-backs sent", func() bool { return r.Stats().WriteBackPending == 0 })
			if got := used(t, r, "k", l); got != want {
				t.Errorf("Redis counted %d hits, want %d", got, want)
			}
			if st := r.Stats(); st.NotSent != 2 || st.RoundTrips == 0 {
				t.Errorf("stats %+v: want 2 calls not sent", st)
			}
		})
	}
}

// Close writes back the hits allowed while Redis was away (failure mode
// local) once Redis answers, within Options.CloseWriteBack: a Redis that
// resumes as the store closes counts every allowed hit, exactly; one that
// stays frozen loses them, and Close says how many, as does
// Stats.WriteBackDroppedAtClose. Before, Close dropped them silently.
func TestCloseWritesBackPendingHits(t *testing.T) {
	l := algorithms.Limit{Algorithm: algorithms.FixedWindow, Requests: 1000, Window: time.Hour}
	t.Run("resumed", func(t *testing.T) {
		srv := redistest.StartStandalone(t)
		fb := memory.New()
		defer fb.Close()
		r, err := redis.New(redis.Options{URL: srv.URL(), BatchSize: 1, ReadTimeout: time.Minute, WriteTimeout: time.Minute, Fallback: fb, CloseWriteBack: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		srv.Pause()
		allowed, failed := burst(r, "k", l, 30, 50*time.Millisecond)
		if allowed != 30 || failed != 0 {
			t.Fatalf("frozen: %d allowed, %d failed; want 30 allowed locally", allowed, failed)
		}
		if st := r.Stats(); st.WriteBackPending == 0 {
			t.Fatalf("nothing waits to be written back: %+v", st)
		}
		closed := make(chan error, 1)
		go func() { closed <- r.Close() }()
		srv.Resume()
		if err := <-closed; err != nil {
			t.Fatalf("Close: %v", err)
		}
		st := r.Stats()
		t.Logf("stats at close: %+v", st)
		if st.WriteBackPending != 0 || st.WriteBackDroppedAtClose != 0 {
			t.Errorf("pending %d, dropped at close %d: want none", st.WriteBackPending, st.WriteBackDroppedAtClose)
		}
		check := newRedisStore(t, redis.Options{URL: srv.URL()})
		if got := used(t, check, "k", l); got != 30 {
			t.Errorf("Redis counted %d of the 30 hits allowed locally", got)
		}
	})
	t.Run("frozen", func(t *testing.T) {
		srv := redistest.StartStandalone(t)
		defer srv.Resume()
		fb := memory.New()
		defer fb.Close()
		const bound = 300 * time.Millisecond
		r, err := redis.New(redis.Options{URL: srv.URL(), BatchSize: 1, ReadTimeout: bound, Fallback: fb, CloseWriteBack: bound})
		if err != nil {
			t.Fatal(err)
		}
		srv.Pause()
		allowed, failed := burst(r, "k", l, 20, 50*time.Millisecond)
		if allowed != 20 || failed != 0 {
			t.Fatalf("frozen: %d allowed, %d failed; want 20 allowed locally", allowed, failed)
		}
		err = r.Close()
		if err == nil || !strings.Contains(err.Error(), "20 hits of 1 keys") {
			t.Fatalf("Close: %v, want it to name the 20 hits not written back", err)
		}
		if st := r.Stats(); st.WriteBackDroppedAtClose != 20 || st.WriteBackPending != 0 {
			t.Errorf("dropped at close %d, pending %d: want 20 and 0", st.WriteBackDroppedAtClose, st.WriteBackPending)
		}
	})
}

// A refused call (no fallback, not counted open: failure mode deny) whose
// pipeline timed out on a frozen Redis may run when Redis resumes, its
// reply lost: LateUnsure counts it, so that Redis's count stays within what
// the store reports (the OKs, LateCharged and LateUnsure).
func TestTimedOutRefusedCallCountedUnsure(t *testing.T) {
	srv := redistest.StartStandalone(t)
	const readTimeout = 50 * time.Millisecond
	r := newRedisStore(t, redis.Options{URL: srv.URL(), ReadTimeout: readTimeout, WriteTimeout: readTimeout})
	l := algorithms.Limit{Algorithm: algorithms.FixedWindow, Requests: 100, Window: time.Hour}
	out := make([]algorithms.Decision, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := r.Apply(ctx, []backend.Item{{Key: "warm", Limit: l, Hits: 1}}, out); err != nil {
		t.Fatal(err) // loads the script
	}
	srv.Pause()
	_, err := r.Apply(ctx, []backend.Item{{Key: "k", Limit: l, Hits: 1}}, out)
	srv.Resume()
	if err == nil {
		t.Fatal("Apply succeeded on a frozen Redis")
	}
	testutil.WaitFor(t, 10*time.Second, "the refused call counted", func() bool { return r.Stats().LateUnsure+r.Stats().LateCharged > 0 })
	st := r.Stats()
	if st.LateUnsure != 1 {
		t.Errorf("LateUnsure %d, want 1 (the pipeline timed out after it was written: %v)", st.LateUnsure, err)
	}
	testutil.WaitFor(t, 10*time.Second, "Redis answers", func() bool { return srv.Client().Ping(context.Background()).Err() == nil })
	n, xerr := srv.Client().Exists(context.Background(), redis.RedisKey("", backend.Item{Key: "k"})).Result()
	if xerr != nil || uint64(n) > st.LateUnsure+st.LateCharged {
		t.Errorf("Redis holds %d keys charged by the refused call (%v), more than the %d reported", n, xerr, st.LateUnsure+st.LateCharged)
	}
	t.Logf("%v; Redis ran it: %v; stats %+v", err, n == 1, st)
}

// ApplyBy takes the call's budget as a deadline beside its context
// (backend.TakesDeadline, what pkg/rls uses instead of a context with a
// timer): it decides as Apply does while the deadline is ahead (calls in a
// row reuse a pooled call and its timer), sends nothing once it has
// passed, and returns at the deadline from a frozen Redis with an error
// wrapping context.DeadlineExceeded, charging the call once Redis resumes
// and runs it, as for a context's deadline.
func TestApplyByDeadline(t *testing.T) {
	srv := redistest.StartStandalone(t)
	r := newRedisStore(t, redis.Options{URL: srv.URL(), ReadTimeout: time.Minute, WriteTimeout: time.Minute})
	var _ backend.TakesDeadline = r
	l := algorithms.Limit{Algorithm: algorithms.FixedWindow, Requests: 100, Window: time.Hour}
	item := []backend.Item{{Key: "k", Limit: l, Hits: 1}}
	out := make([]algorithms.Decision, 1)
	for i := range 5 {
		allowed, err := r.ApplyBy(context.Background(), time.Now().Add(time.Minute), item, out)
		if err != nil || !allowed || out[0].Remaining != uint64(100-1-i) {
			t.Fatalf("ApplyBy %d: %v %v %+v, want allowed with %d remaining", i, allowed, err, out[0], 100-1-i)
		}
	}
	// A context deadline earlier than until still binds.
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Millisecond))
	defer cancel()
	if _, err := r.ApplyBy(ctx, time.Now().Add(time.Minute), item, out); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ApplyBy past ctx's deadline: %v, want DeadlineExceeded", err)
	}
	if _, err := r.ApplyBy(context.Background(), time.Now().Add(-time.Millisecond), item, out); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ApplyBy past until: %v, want DeadlineExceeded", err)
	}
	if st := r.Stats(); st.NotSent != 2 {
		t.Fatalf("stats %+v: want 2 calls not sent", st)
	}
	if got := used(t, r, "k", l); got != 5 {
		t.Fatalf("Redis counted %d hits, want 5", got)
	}

	srv.Pause()
	done := make(chan error, 1)
	go func() {
		_, err := r.ApplyBy(context.Background(), time.Now().Add(100*time.Millisecond), item, make([]algorithms.Decision, 1))
		done <- err
	}()
	// The client's timeouts are a minute: only the deadline ends the wait.
	if err := <-done; !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ApplyBy on a frozen Redis: %v, want DeadlineExceeded", err)
	}
	srv.Resume()
	settle(t, r)
	st := r.Stats()
	if got := used(t, r, "k", l); got != 5+st.LateCharged {
		t.Errorf("Redis counted %d hits, want 5 + %d charged late", got, st.LateCharged)
	}
	for i := range 3 {
		if allowed, err := r.ApplyBy(context.Background(), time.Now().Add(time.Minute), item, out); err != nil || !allowed {
			t.Fatalf("ApplyBy %d after the freeze: %v %v", i, allowed, err)
		}
	}
}

// Calls are pooled and reused once answered, and each waits with a timer
// of its own: callers whose deadlines pass at random points (before
// queuing, while queued, in flight) beside callers that get their
// answers must never see another call's result nor hang. Each goroutine
// has its own key, so the Remaining of its answers falls strictly.
func TestPooledCallsUnderDeadlines(t *testing.T) {
	srv := redistest.StartStandalone(t)
	r := newRedisStore(t, redis.Options{URL: srv.URL(), BatchSize: 8})
	l := algorithms.Limit{Algorithm: algorithms.FixedWindow, Requests: 1 << 30, Window: time.Hour}
	const workers, calls = 16, 300
	errs := make(chan error, workers)
	for w := range workers {
		go func() {
			item := []backend.Item{{Key: "pool-" + strconv.Itoa(w), Limit: l, Hits: 1}}
			out := make([]algorithms.Decision, 1)
			last := uint64(math.MaxUint64)
			answered := 0
			for i := range calls {
				// Deadlines from already past to a few round trips away,
				// and every seventh a minute away (answered).
				until := time.Now().Add(time.Duration(i%7-1) * 200 * time.Microsecond)
				if i%7 == 6 {
					until = time.Now().Add(time.Minute)
				}
				allowed, err := r.ApplyBy(context.Background(), until, item, out)
				if err != nil {
					if !errors.Is(err, context.DeadlineExceeded) {
						errs <- fmt.Errorf("worker %d call %d: %v", w, i, err)
						return
					}
					continue
				}
				if !allowed || out[0].Remaining >= last || out[0].Limit != l.Requests {
					errs <- fmt.Errorf("worker %d call %d: %v %+v after remaining %d", w, i, allowed, out[0], last)
					return
				}
				last = out[0].Remaining
				answered++
			}
			if answered == 0 {
				errs <- fmt.Errorf("worker %d: no call answered", w)
				return
			}
			errs <- nil
		}()
	}
	for range workers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("stats %+v", r.Stats())
}
