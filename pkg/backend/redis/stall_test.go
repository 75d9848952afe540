package redis_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/envoyrls/envoy-rls/internal/redistest"
	"github.com/envoyrls/envoy-rls/internal/schedprobe"
	"github.com/envoyrls/envoy-rls/internal/testutil"
	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/backend"
	"github.com/envoyrls/envoy-rls/pkg/backend/redis"
)

// stallLoad runs clients goroutines calling Apply on key with deadline
// until stopped, and records how each call ended.
type stallLoad struct {
	mu      sync.Mutex
	results []stallResult
	stop    chan struct{}
	wg      sync.WaitGroup
}

type stallResult struct {
	start, end time.Time
	err        error
}

func startStallLoad(r *redis.Store, clients int, deadline time.Duration, key func(c int) backend.Item) *stallLoad {
	ld := &stallLoad{stop: make(chan struct{})}
	for c := 0; c < clients; c++ {
		ld.wg.Add(1)
		go func() {
			defer ld.wg.Done()
			items := []backend.Item{key(c)}
			out := make([]algorithms.Decision, 1)
			for {
				select {
				case <-ld.stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), deadline)
				start := time.Now()
				_, err := r.Apply(ctx, items, out)
				end := time.Now()
				cancel()
				ld.mu.Lock()
				ld.results = append(ld.results, stallResult{start, end, err})
				ld.mu.Unlock()
				if err != nil {
					// A failure mode's answer comes at once: do not spin.
					time.Sleep(time.Millisecond)
				}
			}
		}()
	}
	return ld
}

func (ld *stallLoad) halt() {
	close(ld.stop)
	ld.wg.Wait()
}

// count returns the calls ended after from that match f.
func (ld *stallLoad) count(from time.Time, f func(stallResult) bool) int {
	ld.mu.Lock()
	defer ld.mu.Unlock()
	n := 0
	for _, r := range ld.results {
		if r.end.After(from) && f(r) {
			n++
		}
	}
	return n
}

// countStarted returns the calls started after from that match f.
func (ld *stallLoad) countStarted(from time.Time, f func(stallResult) bool) int {
	ld.mu.Lock()
	defer ld.mu.Unlock()
	n := 0
	for _, r := range ld.results {
		if r.start.After(from) && f(r) {
			n++
		}
	}
	return n
}

// firstDown returns when the first call after from ended with ErrNodeDown.
func (ld *stallLoad) firstDown(from time.Time) time.Time {
	ld.mu.Lock()
	defer ld.mu.Unlock()
	var first time.Time
	for _, r := range ld.results {
		if r.end.After(from) && errors.Is(r.err, redis.ErrNodeDown) && (first.IsZero() || r.end.Before(first)) {
			first = r.end
		}
	}
	return first
}

// slowest returns the longest call that started after from.
func (ld *stallLoad) slowest(from time.Time) time.Duration {
	ld.mu.Lock()
	defer ld.mu.Unlock()
	var w time.Duration
	for _, r := range ld.results {
		if r.start.After(from) {
			w = max(w, r.end.Sub(r.start))
		}
	}
	return w
}

func stallLimit() algorithms.Limit {
	return algorithms.Limit{Algorithm: algorithms.TokenBucket, Requests: 1 << 40, Window: time.Second}
}

// busyItems returns n items of stallLimit, keys prefix-c-i: a request whose
// script call keeps Redis busy.
func busyItems(prefix string, c, n int) []backend.Item {
	its := make([]backend.Item, n)
	for i := range its {
		its[i] = backend.Item{Key: fmt.Sprintf("%s-%d-%d", prefix, c, i), Limit: stallLimit(), Hits: 1}
	}
	return its
}

// healthLog records a store's OnNodeHealth events and when they came.
type healthLog struct {
	mu     sync.Mutex
	events []redis.NodeHealth
	at     []time.Time
}

func (l *healthLog) note(h redis.NodeHealth) {
	l.mu.Lock()
	l.events = append(l.events, h)
	l.at = append(l.at, time.Now())
	l.mu.Unlock()
}

// firstDown returns when the first down event came (zero when none did).
func (l *healthLog) firstDown() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, e := range l.events {
		if e.Down {
			return l.at[i]
		}
	}
	return time.Time{}
}

// check reports unless the events are a down then an up.
func (l *healthLog) check(t *testing.T) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if e := l.events; len(e) != 2 || !e[0].Down || e[0].Err == nil || e[1].Down || e[1].For <= 0 {
		t.Errorf("OnNodeHealth got %+v, want a down then an up", e)
	}
}

// TestStallFrozen: Redis frozen (SIGSTOP) under a load of callers with 2 s
// deadlines. The store notices it within twice the stall timeout (plus its
// tick, the round trips its PING may wait behind, and the measured
// scheduling slack), not at the callers' deadline: every call sent later
// answers ErrNodeDown at once. (The calls already in flight wait for their
// replies: the read timeout here outlasts the freeze.) Resumed (SIGCONT),
// Redis decides again by itself, and the calls that were in flight are
// resolved by their replies (nothing counts as maybe charged).
func TestStallFrozen(t *testing.T) {
	srv := redistest.StartStandalone(t)
	const stall = 30 * time.Millisecond
	var hl healthLog
	r := newRedisStore(t, redis.Options{URL: srv.URL(), StallTimeout: stall, ReadTimeout: 5 * time.Second, OnNodeHealth: hl.note})
	ld := startStallLoad(r, 8, 2*time.Second, func(c int) backend.Item { return backend.Item{Key: fmt.Sprint("k", c), Limit: stallLimit(), Hits: 1} })
	defer ld.halt()
	ok := func(s stallResult) bool { return s.err == nil }
	testutil.WaitFor(t, 10*time.Second, "calls succeed", func() bool { return ld.count(time.Time{}, ok) > 100 })
	healthyFrom := time.Now()
	testutil.WaitFor(t, 10*time.Second, "a healthy baseline", func() bool { return ld.count(healthyFrom, ok) > 100 })
	// The probe's connection is opened once the node has traffic: the
	// bound below is for a freeze that finds it open (a freeze before it
	// is TestStallFrozenBeforeFirstCall's).
	testutil.WaitFor(t, 10*time.Second, "the probe's connection open", func() bool { return redis.ProbeWarm(r) })
	rtt := ld.slowest(healthyFrom)

	probe := schedprobe.Start()
	srv.Pause()
	paused := time.Now()
	testutil.WaitFor(t, 10*time.Second, "the node found down", func() bool { return !hl.firstDown().IsZero() })
	tripped := hl.firstDown()
	noticed := tripped.Sub(paused)
	// Calls sent once it is down answer at once (well before their
	// deadline), when the callers' calls in flight have come back.
	testutil.WaitFor(t, 10*time.Second, "calls answer ErrNodeDown", func() bool {
		return ld.countStarted(tripped, func(s stallResult) bool { return errors.Is(s.err, redis.ErrNodeDown) }) > 100
	})
	slowest := ld.slowest(tripped)
	// No reply for the stall timeout, noticed within a tick, then a
	// PING that fails after the stall timeout and twice the recent
	// longest round trip (one pipeline in flight, and one more; a healthy
	// call's latency is at least a round trip) on the probe's open
	// connection.
	bound := 2*stall + stall/4 + 2*rtt
	slack := probe.Stop()
	if noticed > bound+slack {
		t.Errorf("the freeze was noticed after %v, want within %v (+ measured scheduling slack %v)", noticed, bound, slack)
	}
	if slowest > bound+slack {
		t.Errorf("a call sent once the node was down took %v, want at most %v (+ slack %v)", slowest, bound, slack)
	}
	if st := r.Stats(); st.NodesDown != 1 || st.NodeTrips != 1 {
		t.Errorf("while frozen: %d nodes down, %d trips, want 1 and 1", st.NodesDown, st.NodeTrips)
	}

	srv.Resume()
	resumed := time.Now()
	testutil.WaitFor(t, 10*time.Second, "calls succeed again", func() bool { return ld.count(resumed, ok) > 100 })
	st := r.Stats()
	if st.NodesDown != 0 || st.NodeReturns != 1 {
		t.Errorf("after the resume: %d nodes down, %d returns, want 0 and 1", st.NodesDown, st.NodeReturns)
	}
	if st.LateUnsure != 0 {
		t.Errorf("%d calls in flight at the freeze count as maybe charged: their pipeline did not wait for its replies", st.LateUnsure)
	}
	hl.check(t)
	t.Logf("noticed after %v (bound %v + slack %v), slowest call after %v; stats %+v", noticed, bound, slack, slowest, st)
}

// TestStallFrozenBeforeFirstCall: Redis frozen before the store's first
// call, so that the first pipelines, and the PING that opens the probe's
// connection, meet the freeze. It is noticed within the bound of a freeze
// under way (with a new connection's handshake for the probe's PING), not
// when the opening PING gives up at the read timeout.
func TestStallFrozenBeforeFirstCall(t *testing.T) {
	srv := redistest.StartStandalone(t)
	const stall = 30 * time.Millisecond
	var hl healthLog
	r := newRedisStore(t, redis.Options{URL: srv.URL(), StallTimeout: stall, ReadTimeout: 5 * time.Second, OnNodeHealth: hl.note})
	probe := schedprobe.Start()
	srv.Pause()
	paused := time.Now()
	ld := startStallLoad(r, 8, 2*time.Second, func(c int) backend.Item { return backend.Item{Key: fmt.Sprint("k", c), Limit: stallLimit(), Hits: 1} })
	defer ld.halt()
	testutil.WaitFor(t, 10*time.Second, "the node found down", func() bool { return !hl.firstDown().IsZero() })
	noticed := hl.firstDown().Sub(paused)
	slack := probe.Stop()
	// No progress for the stall timeout (a tick to notice it), then a
	// PING on a new connection: the stall timeout twice.
	if bound := 3*stall + stall/4; noticed > bound+slack {
		t.Errorf("a freeze before the first call was noticed after %v, want within %v (+ measured scheduling slack %v)", noticed, bound, slack)
	}
	srv.Resume()
	resumed := time.Now()
	ok := func(s stallResult) bool { return s.err == nil }
	testutil.WaitFor(t, 10*time.Second, "calls succeed once resumed", func() bool { return ld.count(resumed, ok) > 100 })
	hl.check(t)
	t.Logf("noticed after %v (slack %v); stats %+v", noticed, slack, r.Stats())
}

// TestStallKilled: Redis killed under load: the first failed connection
// trips the node at once (a refused dial fails its probe), calls answer
// ErrNodeDown without waiting, and the restarted server decides again.
func TestStallKilled(t *testing.T) {
	srv := redistest.StartStandalone(t)
	const stall = 30 * time.Millisecond
	r := newRedisStore(t, redis.Options{URL: srv.URL(), StallTimeout: stall})
	ld := startStallLoad(r, 8, 2*time.Second, func(c int) backend.Item { return backend.Item{Key: fmt.Sprint("k", c), Limit: stallLimit(), Hits: 1} })
	defer ld.halt()
	ok := func(s stallResult) bool { return s.err == nil }
	testutil.WaitFor(t, 10*time.Second, "calls succeed", func() bool { return ld.count(time.Time{}, ok) > 100 })

	probe := schedprobe.Start()
	srv.Stop()
	killed := time.Now()
	testutil.WaitFor(t, 10*time.Second, "calls answer ErrNodeDown", func() bool {
		return ld.count(killed, func(s stallResult) bool { return errors.Is(s.err, redis.ErrNodeDown) }) > 100
	})
	noticed := ld.firstDown(killed).Sub(killed)
	slowest := ld.slowest(killed)
	slack := probe.Stop()
	// A refused connection needs no stall timeout: a tick at most.
	if bound := stall / 4; noticed > bound+slack {
		t.Errorf("the kill was noticed after %v, want within %v (+ measured scheduling slack %v)", noticed, bound, slack)
	}
	if bound := stall; slowest > bound+slack {
		t.Errorf("a call sent after the kill took %v, want at most %v (+ slack %v)", slowest, bound, slack)
	}

	srv.Restart()
	back := time.Now()
	testutil.WaitFor(t, 10*time.Second, "calls succeed again", func() bool { return ld.count(back, ok) > 100 })
	st := r.Stats()
	if st.NodesDown != 0 || st.NodeTrips == 0 || st.NodeReturns != st.NodeTrips {
		t.Errorf("after the restart: %d nodes down, %d trips, %d returns", st.NodesDown, st.NodeTrips, st.NodeReturns)
	}
	t.Logf("noticed after %v, slowest call after the kill %v (slack %v); stats %+v", noticed, slowest, slack, st)
}

// TestStallOverloadNoTrip: a healthy Redis kept busy by many concurrent
// callers whose requests make long script calls (64 items each, pipelines
// of up to 64 requests: script calls of thousands of keys, many of which
// send no reply byte for longer than a stall timeout of 10 ms) is not
// down: the stalls are checked (probes run), every PING is answered, and
// no call is refused.
func TestStallOverloadNoTrip(t *testing.T) {
	srv := redistest.StartStandalone(t)
	// Long read and write timeouts: a pipeline is never given up on, whatever the
	// load (only the stall check is tested here).
	r := newRedisStore(t, redis.Options{URL: srv.URL(), StallTimeout: 10 * time.Millisecond, Pipelines: 2, ReadTimeout: time.Minute, WriteTimeout: time.Minute, OnNodeHealth: func(h redis.NodeHealth) { t.Logf("%+v", h) }})
	// A first call loads the script and measures a round trip.
	redisApply(t, r, backend.Item{Key: "warm", Limit: stallLimit(), Hits: 1})
	const items = 64
	var calls, failed atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for c := 0; c < 64; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			its := busyItems("ov", c, items)
			out := make([]algorithms.Decision, items)
			for {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				_, err := r.Apply(ctx, its, out)
				cancel()
				calls.Add(1)
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err)
					time.Sleep(time.Millisecond)
				}
			}
		}()
	}
	testutil.WaitFor(t, 60*time.Second, "stalls checked under load", func() bool {
		return r.Stats().StallProbes >= 3 && calls.Load() >= 5000
	})
	close(stop)
	wg.Wait()
	st := r.Stats()
	if st.NodeTrips != 0 || failed.Load() != 0 {
		t.Errorf("a busy Redis was taken for a down one: %d trips, %d of %d calls failed (first: %v)", st.NodeTrips, failed.Load(), calls.Load(), firstErr.Load())
	}
	t.Logf("%d calls, %d probes, %d round trips", calls.Load(), st.StallProbes, st.RoundTrips)
}

// TestCloseBusyRedisCutsNothing: a healthy Redis kept busy by long
// pipelines (as in TestStallOverloadNoTrip: their replies come only when
// all their scripts ran, often after more than the 10 ms stall timeout),
// with lease chunks being reserved. What Close does to stuck reads while
// it waits for lease's background calls, run every 2 ms for 300 ms, cuts
// none of its reads (cutting those older than the stall timeout failed
// calls), and Close itself cuts none either: every call ends decided or
// refused as closed, none counts as maybe charged.
func TestCloseBusyRedisCutsNothing(t *testing.T) {
	srv := redistest.StartStandalone(t)
	r, err := redis.New(redis.Options{URL: srv.URL(), StallTimeout: 10 * time.Millisecond, Pipelines: 2, ReadTimeout: time.Minute, WriteTimeout: time.Minute, CloseWriteBack: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	redisApply(t, r, backend.Item{Key: "warm", Limit: stallLimit(), Hits: 1})
	const items = 64
	var calls atomic.Int64
	var mu sync.Mutex
	var others []error
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for c := 0; c < 64; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			its := append(busyItems("busy", c, items), backend.Item{}) // and a lease key
			out := make([]algorithms.Decision, len(its))
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				// A lease key new every few calls: its reservations go to
				// the busy Redis in the background.
				its[items] = backend.Item{Key: fmt.Sprintf("lease-%d-%d", c, n/4), Limit: algorithms.Limit{Algorithm: algorithms.FixedWindow, Requests: 1 << 30, Window: time.Hour}, Hits: 1, Consistency: backend.Lease}
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				_, err := r.Apply(ctx, its, out)
				cancel()
				calls.Add(1)
				if errors.Is(err, backend.ErrClosed) {
					return
				}
				if err != nil {
					mu.Lock()
					others = append(others, err)
					mu.Unlock()
				}
			}
		}()
	}
	testutil.WaitFor(t, 60*time.Second, "a busy Redis with chunks out", func() bool {
		st := r.Stats()
		return calls.Load() >= 1000 && st.StallProbes >= 1 && st.Lease.Chunks >= 10
	})
	for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); time.Sleep(2 * time.Millisecond) {
		redis.EndStuckReads(r)
	}
	cerr := r.Close()
	close(stop)
	wg.Wait()
	st := r.Stats()
	if len(others) > 0 || cerr != nil {
		t.Errorf("%d calls failed otherwise than closed (first: %v); Close: %v", len(others), others[0:min(1, len(others))], cerr)
	}
	// (Refills still queued at Close fail unsent: their context ends.)
	if st.LateUnsure != 0 || st.NodeTrips != 0 || st.Lease.ReturnErrors != 0 {
		t.Errorf("a busy Redis was cut short: %d calls maybe charged, %d trips, lease %+v", st.LateUnsure, st.NodeTrips, st.Lease)
	}
	t.Logf("%d calls, %d probes, lease %+v", calls.Load(), st.StallProbes, st.Lease)
}

// TestStallClusterOneMaster: one master of a 3-master Cluster frozen:
// calls on its slots answer ErrNodeDown once it is noticed, calls on the
// other masters' slots keep being decided by Redis at their usual latency
// (their median within twice the healthy one, plus the measured scheduling
// slack), and the master decides again once resumed.
func TestStallClusterOneMaster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	const stall = 30 * time.Millisecond
	r := newRedisStore(t, redis.Options{ClusterAddrs: cl.Addrs(), StallTimeout: stall})
	// A partition on each master.
	parts := make([]uint64, len(cl.Nodes))
	found := 0
	for p := uint64(1); found < len(cl.Nodes); p++ {
		s := redis.Slot(redis.RedisKey("", backend.Item{Key: "c", Partition: p}))
		for i := range cl.Nodes {
			if lo, hi := redistest.SlotRange(i, len(cl.Nodes)); s >= lo && s <= hi && parts[i] == 0 {
				parts[i] = p
				found++
			}
		}
	}
	const frozen = 1
	ld := startStallLoad(r, 12, 2*time.Second, func(c int) backend.Item {
		return backend.Item{Key: "c", Partition: parts[c%len(parts)], Limit: stallLimit(), Hits: 1}
	})
	defer ld.halt()
	ok := func(s stallResult) bool { return s.err == nil }
	testutil.WaitFor(t, 10*time.Second, "calls succeed", func() bool { return ld.count(time.Time{}, ok) > 300 })
	healthyFrom := time.Now()
	testutil.WaitFor(t, 10*time.Second, "a healthy baseline", func() bool { return ld.count(healthyFrom, ok) > 300 })
	healthy := ld.median(healthyFrom, time.Now(), func(s stallResult) bool { return s.err == nil })

	probe := schedprobe.Start()
	cl.Nodes[frozen].Pause()
	paused := time.Now()
	testutil.WaitFor(t, 10*time.Second, "calls on the frozen master answer ErrNodeDown", func() bool {
		return ld.count(paused, func(s stallResult) bool { return errors.Is(s.err, redis.ErrNodeDown) }) > 100
	})
	tripped := ld.firstDown(paused)
	testutil.WaitFor(t, 10*time.Second, "calls on the other masters go on", func() bool {
		return ld.count(tripped, func(s stallResult) bool { return s.err == nil }) > 300
	})
	during := ld.median(tripped, time.Now(), func(s stallResult) bool { return s.err == nil })
	slack := probe.Stop()
	if during > 2*healthy+slack {
		t.Errorf("healthy slots' median latency %v with a master down, %v before (+ slack %v)", during, healthy, slack)
	}
	var other error
	if n := ld.countStarted(tripped, func(s stallResult) bool {
		if s.err != nil && !errors.Is(s.err, redis.ErrNodeDown) {
			other = s.err
			return true
		}
		return false
	}); n > 0 {
		t.Errorf("%d calls failed otherwise than ErrNodeDown once the master was down (%v)", n, other)
	}
	if st := r.Stats(); st.NodesDown != 1 {
		t.Errorf("%d nodes down, want 1", st.NodesDown)
	}
	cl.Nodes[frozen].Resume()
	resumed := time.Now()
	testutil.WaitFor(t, 10*time.Second, "the master decides again", func() bool {
		return r.Stats().NodesDown == 0 && ld.count(resumed, func(s stallResult) bool { return s.err == nil }) > 300
	})
	t.Logf("healthy median %v, with a master down %v (slack %v); stats %+v", healthy, during, slack, r.Stats())
}

// median returns the median latency of the calls that ended between from
// and to and match f.
func (ld *stallLoad) median(from, to time.Time, f func(stallResult) bool) time.Duration {
	ld.mu.Lock()
	defer ld.mu.Unlock()
	var d []time.Duration
	for _, r := range ld.results {
		if r.end.After(from) && r.end.Before(to) && f(r) {
			d = append(d, r.end.Sub(r.start))
		}
	}
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	return d[len(d)/2]
}
