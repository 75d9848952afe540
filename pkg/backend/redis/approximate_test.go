package redis_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/envoyrls/envoy-rls/internal/redistest"
	"github.com/envoyrls/envoy-rls/internal/schedprobe"
	"github.com/envoyrls/envoy-rls/internal/testutil"
	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/backend"
	"github.com/envoyrls/envoy-rls/pkg/backend/redis"
)

// approxAlgorithms are the algorithms consistency approximate decides on
// local counters.
var approxAlgorithms = []algorithms.Kind{algorithms.FixedWindow, algorithms.SlidingWindowCounter}

func TestApproximateBoundStandalone(t *testing.T) {
	srv := redistest.StartStandalone(t)
	testApproximateBound(t, redis.Options{URL: srv.URL()})
}

func TestApproximateBoundCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	cl := redistest.StartCluster(t, 3)
	testApproximateBound(t, redis.Options{ClusterAddrs: cl.Addrs()})
}

// testApproximateBound runs three instances on one Redis along one
// timeline, with random requests of approximate items (and strict ones
// beside them) on a few keys, and replays every admitted request through
// the strict model, which charges it whatever it says. The stated bound:
// the hits admitted that the model denies are no more than the hits of
// approximate items that were decided strict (a key's first decisions on
// an instance, until its sync answers), per fixed window and over the run.
//
// It runs twice: as configured, where 60 an hour is never plenty for
// chunks of lease (no decision comes from one), and with the plenty factor
// lowered to 2, where keys take chunks of lease while what remains is at
// least 2 × instances × the chunk and go to shares after: chunks, shares
// and hits counted must stay within the same bound.
func testApproximateBound(t *testing.T, opts redis.Options) {
	for _, plenty := range []uint64{0, 1} {
		for _, alg := range approxAlgorithms {
			name := alg.String()
			if plenty > 0 {
				name = "chunks/" + name
			}
			t.Run(name, func(t *testing.T) { testApproximateBoundOf(t, opts, alg, plenty) })
		}
	}
}

func testApproximateBoundOf(t *testing.T, opts redis.Options, alg algorithms.Kind, plenty uint64) {
	{
		{
			clock := testutil.NewClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
			o := opts
			o.KeyPrefix = fmt.Sprintf("approx-%s-%d:", alg, time.Now().UnixNano())
			o.ApproximateSyncInterval = 5 * time.Millisecond
			var stores []*redis.Store
			for range 3 {
				s := newClockedRedisStore(t, clock, o)
				if plenty > 0 {
					redis.SetLeasePlenty(s, plenty)
				}
				stores = append(stores, s)
			}
			l := algorithms.Limit{Algorithm: alg, Requests: 60, Window: time.Second}
			const keys = 3
			model := make([]algorithms.State, keys)
			type win struct {
				k     int
				start int64
			}
			admittedIn, strictIn := map[win]uint64{}, map[win]uint64{}
			rng := rand.New(rand.NewPCG(2+plenty, uint64(alg)))
			var admitted, over, strictHits, local, denied uint64
			ctx := context.Background()
			out := make([]algorithms.Decision, 2)
			for step := range 4000 {
				k := rng.IntN(keys)
				hits := uint64(rng.IntN(3)) + 1
				if rng.IntN(10) == 0 {
					hits = 0
				}
				items := []backend.Item{{Key: fmt.Sprintf("k%d", k), Limit: l, Hits: hits, Partition: uint64(k + 1), Consistency: backend.Approximate}}
				if rng.IntN(8) == 0 {
					items = append(items, backend.Item{Key: fmt.Sprintf("strict%d", k), Limit: algorithms.Limit{Requests: 30, Window: time.Second}, Hits: 1, Partition: uint64(k + 1)})
				}
				s := stores[rng.IntN(len(stores))]
				before := s.Stats()
				allowed, err := s.Apply(ctx, items, out)
				if err != nil {
					t.Fatalf("step %d: %v", step, err)
				}
				after := s.Stats()
				wasStrict := after.Approximate.Strict > before.Approximate.Strict
				if !wasStrict {
					local++
				}
				now := clock.Now().UnixMicro()
				w := win{k, now - now%l.Window.Microseconds()}
				if allowed {
					next, d := algorithms.AccountMicros(l, model[k], now, hits)
					model[k] = next
					if !d.Allowed {
						over += hits
					}
					admitted += hits
					admittedIn[w] += hits
					if wasStrict {
						strictHits += hits
						strictIn[w] += hits
					}
				} else {
					denied++
				}
				if rng.IntN(4) == 0 {
					clock.Advance(time.Duration(rng.IntN(20_000)) * time.Microsecond)
				}
				if step%20 == 0 {
					// Let syncs land now and then, as they do between
					// requests in real time.
					time.Sleep(3 * time.Millisecond)
				}
			}
			if alg == algorithms.FixedWindow {
				for w, n := range admittedIn {
					if n > l.Requests+strictIn[w] {
						t.Errorf("key %d, window %d: %d hits admitted, over the bound of %d + %d decided strict", w.k, w.start, n, l.Requests, strictIn[w])
					}
				}
			}
			if over > strictHits {
				t.Errorf("%d hits admitted over the strict model, more than the %d decided strict", over, strictHits)
			}
			if local == 0 || denied == 0 {
				t.Fatalf("the run decided %d requests locally and denied %d: it tests nothing", local, denied)
			}
			var st redis.ApproximateStats
			for _, s := range stores {
				a := s.Stats().Approximate
				st.Syncs += a.Syncs
				st.SyncErrors += a.SyncErrors
				st.OverAdmitted += a.OverAdmitted
				st.Strict += a.Strict
				st.Chunked += a.Chunked
			}
			if (st.Chunked > 0) != (plenty > 0) {
				t.Errorf("%d requests decided from lease chunks with plenty factor %d", st.Chunked, plenty)
			}
			t.Logf("%d hits admitted (%d over the model, %d decided strict), %d requests decided locally, %d denied; stats %+v", admitted, over, strictHits, local, denied, st)
		}
	}
}

// BenchmarkRedisApproximate: one fixed-window item (a minute's window) per
// request with consistency approximate, on one hot key, 10,000 keys in turn
// and 10,000 keys drawn with Zipf s = 1.1 (compare BenchmarkRedisLease's
// strict rows). redis-cpu-µs/op is Redis's CPU per decision. The limit is
// plenty, so lease chunks decide; the shares/ rows take the plenty factor
// out of reach, so that shares and syncs decide as for limits of thousands.
func BenchmarkRedisApproximate(b *testing.B) {
	keys := tenThousandKeys()
	rng := rand.New(rand.NewPCG(1, 2))
	zipf := rand.NewZipf(rng, 1.1, 1, 9_999)
	var mu sync.Mutex
	zipfKeys := func(uint64) string {
		mu.Lock()
		k := zipf.Uint64()
		mu.Unlock()
		return keys(k)
	}
	for _, sc := range []struct {
		name string
		key  func(uint64) string
	}{{"hot", func(uint64) string { return "hot" }}, {"10k", keys}, {"zipf10k", zipfKeys}} {
		for _, shares := range []bool{false, true} {
			name := sc.name
			if shares {
				name = "shares/" + name
			}
			b.Run(name, func(b *testing.B) {
				l := bigLimit(algorithms.FixedWindow)
				l.Window = time.Minute // as make bench's
				benchLeasePlenty = 0
				if shares {
					benchLeasePlenty = 1 << 62
				}
				defer func() { benchLeasePlenty = 0 }()
				benchRedisConsistency(b, redis.Options{}, l, sc.key, backend.Approximate)
			})
		}
	}
}

// TestApproximateSyncsCountOnce: hits admitted on local counters, and usage
// accounting charged there, are counted in Redis exactly once, through a
// Redis frozen long enough for syncs to time out (they run when it
// resumes, and are sent again: the batch numbers make the second a no-op).
func TestApproximateSyncsCountOnce(t *testing.T) {
	srv := redistest.StartStandalone(t)
	prefix := fmt.Sprintf("once-%d:", time.Now().UnixNano())
	r, err := redis.New(redis.Options{URL: srv.URL(), KeyPrefix: prefix, ApproximateSyncInterval: 20 * time.Millisecond, ReadTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	// 7,000 is not plenty for chunks of lease (8,000 for one instance):
	// shares and syncs decide.
	l := algorithms.Limit{Algorithm: algorithms.FixedWindow, Requests: 7_000, Window: time.Hour}
	req := []backend.Item{
		{Key: "hits", Limit: l, Hits: 1, Partition: 3, Consistency: backend.Approximate},
		{Key: "usage", Limit: l, Hits: 3, Partition: 3, Account: true, Consistency: backend.Approximate},
	}
	out := make([]algorithms.Decision, 2)
	var allowed, requests, unsure uint64
	apply := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		ok, err := r.Apply(ctx, req, out)
		switch {
		case err != nil:
			unsure++ // may run once Redis resumes
		case ok:
			allowed++
		}
		requests++
	}
	testutil.WaitFor(t, 10*time.Second, "local decisions", func() bool {
		apply()
		return r.Stats().ApproximateDecided > 50
	})
	srv.Pause()
	frozen := r.Stats().Approximate.SyncErrors
	testutil.WaitFor(t, 10*time.Second, "a sync timed out", func() bool {
		apply()
		return r.Stats().Approximate.SyncErrors > frozen
	})
	srv.Resume()
	for range 20 {
		apply()
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	count := func(it backend.Item) float64 {
		f := leaseState(t, srv, prefix, it)
		if len(f) < 2 {
			return 0
		}
		return f[1]
	}
	hits, usage := count(req[0]), count(req[1])
	if hits < float64(allowed) || hits > float64(allowed+unsure) {
		t.Errorf("Redis counts %v hits, want the %d allowed (and up to %d calls that failed)", hits, allowed, unsure)
	}
	if usage < float64(3*(requests-unsure)) || usage > float64(3*requests) {
		t.Errorf("Redis counts %v hits of usage accounting, want 3 for each of the %d requests answered (and up to %d that failed)", usage, requests-unsure, unsure)
	}
	if allowed+unsure != requests {
		t.Errorf("%d of %d requests denied, with a limit far away", requests-allowed-unsure, requests)
	}
	st := r.Stats().Approximate
	if st.SyncErrors == 0 || st.LostHits != 0 {
		t.Errorf("stats %+v: want failed syncs and no hit lost", st)
	}
	t.Logf("%d requests, %d allowed, %d failed; Redis counts %v hits and %v of usage; %+v", requests, allowed, unsure, hits, usage, st)
}

// TestApproximateCloseFrozenNamesLostHits: hits admitted on local counters
// while Redis is frozen cannot be synced by Close: Close's error names
// them and Stats counts them (LostHits), so that none goes uncounted
// without a word. Once Redis resumes, what it counts and what Close named
// lost cover every hit allowed.
func TestApproximateCloseFrozenNamesLostHits(t *testing.T) {
	srv := redistest.StartStandalone(t)
	prefix := fmt.Sprintf("lost-%d:", time.Now().UnixNano())
	r, err := redis.New(redis.Options{URL: srv.URL(), KeyPrefix: prefix, CloseWriteBack: 400 * time.Millisecond, ApproximateSyncInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	// Not plenty for lease's chunks: shares and syncs decide.
	it := backend.Item{Key: "k", Limit: algorithms.Limit{Algorithm: algorithms.FixedWindow, Requests: 7_000, Window: time.Hour}, Hits: 1, Partition: 4, Consistency: backend.Approximate}
	out := make([]algorithms.Decision, 1)
	var allowed uint64
	apply := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		if ok, err := r.Apply(ctx, []backend.Item{it}, out); err == nil && ok {
			allowed++
		}
	}
	testutil.WaitFor(t, 10*time.Second, "local decisions, synced", func() bool {
		apply()
		st := r.Stats()
		return st.ApproximateDecided > 20 && st.Approximate.Syncs > 2
	})
	srv.Pause()
	before := r.Stats().ApproximateDecided
	for range 30 {
		apply()
	}
	local := r.Stats().ApproximateDecided - before
	cerr := r.Close()
	srv.Resume()
	lost := r.Stats().Approximate.LostHits
	if local == 0 || lost == 0 {
		t.Fatalf("%d decisions local while frozen, %d hits named lost: the test shows nothing", local, lost)
	}
	if cerr == nil || !strings.Contains(cerr.Error(), fmt.Sprintf("%d hits of consistency approximate not counted", lost)) {
		t.Errorf("Close: %v, want it to name the %d hits not counted", cerr, lost)
	}
	var counted float64
	testutil.WaitFor(t, 10*time.Second, "Redis answers again", func() bool {
		return srv.Client().Ping(context.Background()).Err() == nil
	})
	if f := leaseState(t, srv, prefix, it); len(f) >= 2 {
		counted = f[1]
	}
	// A sync in flight at the freeze may run when Redis resumes: then
	// its hits are both counted and named lost.
	if counted+float64(lost) < float64(allowed) || counted > float64(allowed) {
		t.Errorf("Redis counts %v, Close named %d lost, of %d allowed: hits went uncounted unnamed", counted, lost, allowed)
	}
	t.Logf("%d allowed (%d local while frozen), Redis counts %v, %d named lost: %v", allowed, local, counted, lost, cerr)
}

// TestApproximateOverLimitStaysLocal: a fixed window that a sync found used
// up is denied locally until it ends, without Redis (no sync, no strict
// call), with a retry after that ends with the window; its end brings
// admissions back.
func TestApproximateOverLimitStaysLocal(t *testing.T) {
	srv := redistest.StartStandalone(t)
	clock := testutil.NewClock(time.Date(2030, 1, 1, 0, 0, 30, 0, time.UTC))
	r := newClockedRedisStore(t, clock, redis.Options{URL: srv.URL(), KeyPrefix: fmt.Sprintf("full-%d:", time.Now().UnixNano()), ApproximateSyncInterval: 5 * time.Millisecond})
	it := backend.Item{Key: "k", Limit: algorithms.Limit{Algorithm: algorithms.FixedWindow, Requests: 20, Window: time.Minute}, Hits: 1, Partition: 5, Consistency: backend.Approximate}
	var allowed int
	var d []algorithms.Decision
	// Denied locally first as the share is spent (retry after a sync
	// interval), then, once a sync found the window used up, until it ends.
	testutil.WaitFor(t, 10*time.Second, "a local denial until the window ends", func() bool {
		before := r.Stats()
		var ok bool
		d, ok = redisApply(t, r, it)
		if ok {
			allowed++
			return false
		}
		after := r.Stats()
		return after.ApproximateDecided > before.ApproximateDecided && after.Decided == before.Decided && d[0].RetryAfter > time.Second
	})
	if allowed != 20 {
		t.Fatalf("%d allowed on one instance, want the limit, 20 (no other instance holds a share)", allowed)
	}
	if d[0].RetryAfter != 30*time.Second {
		t.Fatalf("a local denial says retry after %v, want the 30 s left in the window", d[0].RetryAfter)
	}
	before := r.Stats()
	for range 100 {
		if _, ok := redisApply(t, r, it); ok {
			t.Fatal("allowed over the limit")
		}
	}
	after := r.Stats()
	if after.ApproximateDecided-before.ApproximateDecided != 100 || after.Decided != before.Decided || after.Approximate.Syncs != before.Approximate.Syncs {
		t.Fatalf("100 requests over the limit: %d decided locally, %d by Redis, %d syncs; want 100, 0, 0",
			after.ApproximateDecided-before.ApproximateDecided, after.Decided-before.Decided, after.Approximate.Syncs-before.Approximate.Syncs)
	}
	clock.Advance(30 * time.Second)
	testutil.WaitFor(t, 10*time.Second, "an admission in the next window", func() bool {
		_, ok := redisApply(t, r, it)
		return ok
	})
}

// TestApproximateChunksCountExactly: with plenty remaining, approximate
// keys are decided from chunks of lease, hits and usage accounting alike
// (a denial elsewhere in the request puts the hits back and keeps the
// usage); Redis counts, once Close has given the unused hits back, exactly
// the hits allowed and the usage charged.
func TestApproximateChunksCountExactly(t *testing.T) {
	srv := redistest.StartStandalone(t)
	prefix := fmt.Sprintf("chunked-%d:", time.Now().UnixNano())
	clock := testutil.NewClock(time.Date(2030, 1, 1, 0, 10, 0, 0, time.UTC))
	r, err := redis.NewWithClock(redis.Options{URL: srv.URL(), KeyPrefix: prefix}, clock)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	l := algorithms.Limit{Algorithm: algorithms.FixedWindow, Requests: 1_000_000, Window: time.Hour}
	hitsIt := backend.Item{Key: "hits", Limit: l, Hits: 1, Partition: 3, Consistency: backend.Approximate}
	usageIt := backend.Item{Key: "usage", Limit: l, Hits: 5, Partition: 3, Account: true, Consistency: backend.Approximate}
	denyIt := backend.Item{Key: "strict-deny", Limit: algorithms.Limit{Requests: 1, Window: time.Hour}, Hits: 1, Partition: 3}
	var hits, usage, requests uint64
	step := func() {
		requests++
		switch requests % 5 {
		case 0: // usage charged, the request denied by a strict item (but the first)
			if _, ok := redisApply(t, r, hitsIt, usageIt, denyIt); ok {
				hits += hitsIt.Hits
			}
			usage += usageIt.Hits
		case 1, 2:
			if _, ok := redisApply(t, r, hitsIt, usageIt); ok {
				hits += hitsIt.Hits
			}
			usage += usageIt.Hits
		default:
			if _, ok := redisApply(t, r, hitsIt); ok {
				hits += hitsIt.Hits
			}
		}
	}
	testutil.WaitFor(t, 10*time.Second, "decisions from chunks", func() bool {
		step()
		return r.Stats().Approximate.Chunked > 100
	})
	for range 500 {
		step()
	}
	st := r.Stats()
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	count := func(it backend.Item) uint64 {
		f := leaseState(t, srv, prefix, it)
		if len(f) < 2 {
			return 0
		}
		return uint64(f[1])
	}
	if got := count(hitsIt); got != hits {
		t.Errorf("Redis counts %d hits, want the %d allowed", got, hits)
	}
	if got := count(usageIt); got != usage {
		t.Errorf("Redis counts %d of usage, want the %d charged", got, usage)
	}
	if st.ApproximateDecided == 0 || st.Lease.Chunks < 2 {
		t.Errorf("stats %+v: want requests decided without Redis, by chunks of both keys", st)
	}
	t.Logf("%d requests: %d hits and %d of usage counted; %+v %+v", requests, hits, usage, st.Approximate, st.Lease)
}

// TestApproximateBeyondLeaseKeys: once LeaseKeys keys hold chunks, another
// approximate key with plenty left is decided by shares (not strict for
// good): requests on it alone come to be decided without Redis.
func TestApproximateBeyondLeaseKeys(t *testing.T) {
	srv := redistest.StartStandalone(t)
	r, err := redis.New(redis.Options{URL: srv.URL(), KeyPrefix: fmt.Sprintf("full-lease-%d:", time.Now().UnixNano()), LeaseKeys: 1, ApproximateSyncInterval: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	l := algorithms.Limit{Algorithm: algorithms.FixedWindow, Requests: 1_000_000, Window: time.Hour}
	a := backend.Item{Key: "a", Limit: l, Hits: 1, Partition: 1, Consistency: backend.Approximate}
	b := backend.Item{Key: "b", Limit: l, Hits: 1, Partition: 2, Consistency: backend.Approximate}
	testutil.WaitFor(t, 10*time.Second, "a decided from a chunk", func() bool {
		redisApply(t, r, a)
		return r.Stats().Approximate.Chunked > 0
	})
	testutil.WaitFor(t, 10*time.Second, "b decided locally", func() bool {
		before := r.Stats()
		redisApply(t, r, b)
		after := r.Stats()
		return after.ApproximateDecided > before.ApproximateDecided
	})
	if st := r.Stats(); st.Approximate.Syncs == 0 {
		t.Fatalf("b was decided locally without a sync: %+v", st.Approximate)
	}
}

// TestApproximateChunkResidueGoesToShares: an approximate key served by
// chunks (plenty factor 1) whose last chunk keeps fewer hits than its
// requests carry, with too little left for another, goes to shares rather
// than strict for the rest of its window, and still reaches its limit.
func TestApproximateChunkResidueGoesToShares(t *testing.T) {
	srv := redistest.StartStandalone(t)
	clock := testutil.NewClock(time.Date(2030, 1, 1, 0, 0, 10, 0, time.UTC))
	r := newClockedRedisStore(t, clock, redis.Options{URL: srv.URL(), KeyPrefix: fmt.Sprintf("residue-%d:", time.Now().UnixNano()), ApproximateSyncInterval: 5 * time.Millisecond})
	redis.SetLeasePlenty(r, 1)
	l := algorithms.Limit{Algorithm: algorithms.FixedWindow, Requests: 300, Window: time.Minute}
	it := backend.Item{Key: "k", Limit: l, Hits: 3, Partition: 1, Consistency: backend.Approximate}
	var admitted uint64
	for range 120 {
		if _, ok := redisApply(t, r, it); ok {
			admitted += it.Hits
		}
		clock.Advance(2 * time.Millisecond)
		time.Sleep(3 * time.Millisecond) // real time for refills and syncs, as between requests
	}
	st := r.Stats().Approximate
	if st.Chunked == 0 || st.Syncs == 0 {
		t.Fatalf("stats %+v: want chunks and then shares", st)
	}
	if st.Strict > 10 {
		t.Errorf("%d strict decisions of a key that chunks and then shares serve (stats %+v)", st.Strict, st)
	}
	if admitted > l.Requests || admitted < l.Requests-3*it.Hits {
		t.Errorf("%d admitted, want the limit of %d (one instance: no other holds a share)", admitted, l.Requests)
	}
}

// TestApproximateShareSeenByLease: one key decided approximate on one
// instance and lease on another (a rolling reload that changes its
// consistency): the lease instance's reservations see the approximate
// instance's live share as taken, so together they stay within the limit
// plus the hits decided strict on either (strict decisions do not see
// shares: the S of approximate's bound).
func TestApproximateShareSeenByLease(t *testing.T) {
	srv := redistest.StartStandalone(t)
	clock := testutil.NewClock(time.Date(2030, 1, 1, 0, 0, 10, 0, time.UTC))
	o := redis.Options{URL: srv.URL(), KeyPrefix: fmt.Sprintf("mixed-%d:", time.Now().UnixNano()), ApproximateSyncInterval: 5 * time.Millisecond}
	a, b := newClockedRedisStore(t, clock, o), newClockedRedisStore(t, clock, o)
	redis.SetLeasePlenty(b, 1) // B's chunks are large beside the limit
	l := algorithms.Limit{Algorithm: algorithms.FixedWindow, Requests: 100, Window: time.Minute}
	item := func(c backend.Consistency) backend.Item {
		return backend.Item{Key: "k", Limit: l, Hits: 1, Partition: 1, Consistency: c}
	}
	hkey := redis.RedisKey(o.KeyPrefix, item(backend.Approximate)) + ":approx"
	var admitted, strictA, strictB uint64
	fromA := func() {
		before := a.Stats().Approximate.Strict
		if _, ok := redisApply(t, a, item(backend.Approximate)); ok {
			admitted++
			if a.Stats().Approximate.Strict > before {
				strictA++
			}
		}
	}
	// A holds a share: its field in Redis says so.
	testutil.WaitFor(t, 10*time.Second, "a share of A in Redis", func() bool {
		fromA()
		for f, v := range srv.Client().HGetAll(context.Background(), hkey).Val() {
			var seq, w, share, seen float64
			if f != "over" {
				if _, err := fmt.Sscanf(strings.ReplaceAll(v, ",", " "), "%g %g %g %g", &seq, &w, &share, &seen); err == nil && share > 0 {
					return true
				}
			}
		}
		return false
	})
	// B takes what lease lets it, until denied; then A spends its share.
	for range 300 {
		before := b.Stats().Decided
		if _, ok := redisApply(t, b, item(backend.Lease)); ok {
			admitted++
			if b.Stats().Decided > before {
				strictB++
			}
		}
		clock.Advance(time.Millisecond)
		time.Sleep(200 * time.Microsecond) // real time for refills, as between requests
	}
	for range 200 {
		fromA()
	}
	if admitted > l.Requests+strictA+strictB {
		t.Errorf("%d admitted, over the limit %d + the %d + %d decided strict", admitted, l.Requests, strictA, strictB)
	}
	t.Logf("%d admitted (%d strict on A, %d on B)", admitted, strictA, strictB)
}

// TestApproximateHotKeyModestLimit: a hot approximate key whose limit is
// plenty but whose chunks would be small beside its demand (100,000 an
// hour: at most 100 hits a chunk) is decided by shares, locally, rather
// than by many small chunks with strict decisions between them.
func TestApproximateHotKeyModestLimit(t *testing.T) {
	srv := redistest.StartStandalone(t)
	r, err := redis.New(redis.Options{URL: srv.URL(), KeyPrefix: fmt.Sprintf("hot-%d:", time.Now().UnixNano())})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	it := backend.Item{Key: "hot", Limit: algorithms.Limit{Algorithm: algorithms.FixedWindow, Requests: 100_000, Window: time.Hour}, Hits: 1, Partition: 1, Consistency: backend.Approximate}
	const workers, each = 8, 6000
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out := make([]algorithms.Decision, 1)
			for range each {
				if _, err := r.Apply(context.Background(), []backend.Item{it}, out); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	st := r.Stats().Approximate
	if st.Strict > workers*each*15/100 {
		t.Errorf("%d of %d decisions strict (stats %+v)", st.Strict, workers*each, st)
	}
	t.Logf("stats %+v, lease %+v", st, r.Stats().Lease)
}

// TestCloseWithinGraceRedisFrozen: with Redis frozen while lease and
// approximate hold chunks and shares, their background calls and a
// pipeline wait on it, Close takes at most CloseWriteBack, not each path's
// grace and the background calls' timeouts in turn (1.4-3.4 s seen
// before), nor the pipeline's read timeout (1 s).
func TestCloseWithinGraceRedisFrozen(t *testing.T) {
	srv := redistest.StartStandalone(t)
	const grace, readTimeout = 400 * time.Millisecond, redis.DefaultIOTimeout
	r, err := redis.New(redis.Options{URL: srv.URL(), KeyPrefix: fmt.Sprintf("grace-%d:", time.Now().UnixNano()), CloseWriteBack: grace, ApproximateSyncInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	l := algorithms.Limit{Algorithm: algorithms.FixedWindow, Requests: 1_000_000, Window: time.Hour}
	items := func(i int) []backend.Item {
		return []backend.Item{
			{Key: fmt.Sprintf("a%d", i), Limit: l, Hits: 1, Partition: uint64(i + 1), Consistency: backend.Approximate},
			{Key: fmt.Sprintf("l%d", i), Limit: l, Hits: 1, Partition: uint64(i + 1), Consistency: backend.Lease},
		}
	}
	apply := func(i int, d time.Duration) {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		_, _ = r.Apply(ctx, items(i), make([]algorithms.Decision, 2))
	}
	testutil.WaitFor(t, 10*time.Second, "decisions from chunks", func() bool {
		for i := range 20 {
			apply(i, time.Second)
		}
		st := r.Stats()
		return st.ApproximateDecided > 0 && st.Approximate.Chunked > 0
	})
	srv.Pause()
	defer srv.Resume()
	// New keys: their refills and syncs go to the frozen Redis.
	for i := 20; i < 60; i++ {
		apply(i, 20*time.Millisecond)
	}
	probe := schedprobe.Start()
	start := time.Now()
	cerr := r.Close() // its error names what could not be returned or synced
	took := time.Since(start)
	slack := probe.Stop()
	if took > grace+slack {
		t.Errorf("Close took %v with Redis frozen, want at most %v (CloseWriteBack; + measured scheduling slack %v; the read timeout, %v, bounds each background call and pipeline)", took, grace, slack, readTimeout)
	}
	t.Logf("Close took %v: %v", took, cerr)
}
