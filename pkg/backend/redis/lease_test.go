package redis_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/envoyrls/envoy-rls/internal/redistest"
	"github.com/envoyrls/envoy-rls/internal/testutil"
	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/backend"
	"github.com/envoyrls/envoy-rls/pkg/backend/redis"
)

// leaseAlgorithms are the algorithms a chunk serves.
var leaseAlgorithms = []algorithms.Kind{algorithms.FixedWindow, algorithms.SlidingWindowCounter, algorithms.TokenBucket, algorithms.GCRA}

func TestLeaseNeverExceedsStandalone(t *testing.T) {
	srv := redistest.StartStandalone(t)
	testLeaseNeverExceeds(t, redis.Options{URL: srv.URL()})
}

// testLeaseNeverExceeds runs three instances on one Redis along one
// timeline, with random requests of lease items (and some strict ones
// beside them) on a few keys of each algorithm, and checks every request
// admitted against the strict model: the algorithm deciding the admitted
// requests alone, in order, must admit each of them too. So lease never
// admits what strict decisions could not have.
func testLeaseNeverExceeds(t *testing.T, opts redis.Options) {
	for _, alg := range leaseAlgorithms {
		t.Run(alg.String(), func(t *testing.T) {
			clock := testutil.NewClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
			o := opts
			o.KeyPrefix = fmt.Sprintf("never-%s-%d:", alg, time.Now().UnixNano())
			o.LeaseIdle = 300 * time.Millisecond
			var stores []*redis.Store
			for range 3 {
				stores = append(stores, newClockedRedisStore(t, clock, o))
			}
			l := algorithms.Limit{Algorithm: alg, Requests: 60, Window: time.Second}
			if alg.HasBurst() {
				l.Burst = 90
			}
			const keys = 3
			model := make([]algorithms.State, keys)
			rng := rand.New(rand.NewPCG(1, uint64(alg)))
			var admitted, denied uint64
			ctx := context.Background()
			out := make([]algorithms.Decision, 2)
			for step := range 3000 {
				k := rng.IntN(keys)
				hits := uint64(rng.IntN(3)) + 1
				if rng.IntN(10) == 0 {
					hits = 0
				}
				items := []backend.Item{{Key: fmt.Sprintf("k%d", k), Limit: l, Hits: hits, Partition: uint64(k + 1), Consistency: backend.Lease}}
				if rng.IntN(8) == 0 {
					// A strict limit beside it, which sometimes denies.
					items = append(items, backend.Item{Key: fmt.Sprintf("strict%d", k), Limit: algorithms.Limit{Requests: 30, Window: time.Second}, Hits: 1, Partition: uint64(k + 1)})
				}
				allowed, err := stores[rng.IntN(len(stores))].Apply(ctx, items, out)
				if err != nil {
					t.Fatalf("step %d: %v", step, err)
				}
				if allowed {
					next, d := algorithms.DecideMicros(l, model[k], clock.Now().UnixMicro(), hits)
					if !d.Allowed {
						t.Fatalf("step %d: key %d admitted %d hits that the strict model denies (%+v)", step, k, hits, d)
					}
					model[k] = next
					admitted += hits
				} else {
					denied++
				}
				if rng.IntN(4) == 0 {
					clock.Advance(time.Duration(rng.IntN(20_000)) * time.Microsecond)
				}
				if step%50 == 0 {
					// Let refills land now and then, as they do between
					// requests in real time.
					time.Sleep(2 * time.Millisecond)
				}
			}
			var chunk uint64
			for _, s := range stores {
				chunk += s.Stats().ChunkDecided
			}
			if chunk == 0 || denied == 0 {
				t.Fatalf("the run decided %d requests from chunks and denied %d: it tests nothing", chunk, denied)
			}
			t.Logf("%d hits admitted, %d requests denied, %d from chunks", admitted, denied, chunk)
		})
	}
}

// leaseState reads a key's state numbers from Redis.
func leaseState(t *testing.T, srv *redistest.Server, prefix string, it backend.Item) []float64 {
	t.Helper()
	v, err := srv.Client().Get(context.Background(), redis.RedisKey(prefix, it)).Result()
	if err != nil {
		return nil
	}
	_, f, err := redis.StateNumbers(v)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestLeaseChunkReturn: the unused hits of a chunk go back when the key goes
// idle, on a count change and at Close, so that Redis counts only the hits
// admitted; after its window no hit of a sliding counter stays stranded.
func TestLeaseChunkReturn(t *testing.T) {
	srv := redistest.StartStandalone(t)
	for _, alg := range []algorithms.Kind{algorithms.FixedWindow, algorithms.SlidingWindowCounter} {
		for _, how := range []string{"idle", "count change", "close", "window end"} {
			if how == "window end" && alg == algorithms.FixedWindow {
				continue // the window's end frees a fixed window's count by itself
			}
			t.Run(alg.String()+"/"+how, func(t *testing.T) {
				clock := testutil.NewClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
				prefix := fmt.Sprintf("ret-%d:", time.Now().UnixNano())
				r, err := redis.NewWithClock(redis.Options{URL: srv.URL(), KeyPrefix: prefix, LeaseIdle: time.Second, LeaseMinChunk: 20}, clock)
				if err != nil {
					t.Fatal(err)
				}
				defer r.Close()
				it := backend.Item{Key: "k", Limit: algorithms.Limit{Algorithm: alg, Requests: 1000, Window: time.Minute}, Hits: 1, Partition: 7, Consistency: backend.Lease}
				// Strict until the key's demand asks for a chunk and it came.
				admitted := uint64(0)
				testutil.WaitFor(t, 10*time.Second, "a chunk", func() bool {
					if r.Stats().Lease.Granted > 0 {
						return true
					}
					redisApply(t, r, it)
					admitted++
					return false
				})
				// One request from the chunk (of at least 2 hits: it
				// keeps unused ones).
				if _, ok := redisApply(t, r, it); !ok {
					t.Fatal("denied")
				}
				admitted++
				if r.Stats().ChunkDecided == 0 {
					t.Fatal("no request was decided from the chunk")
				}
				if got := leaseState(t, srv, prefix, it); got[1] <= float64(admitted) {
					t.Fatalf("Redis counts %v hits with a chunk held, want more than the %d admitted", got[1], admitted)
				}
				switch how {
				case "idle":
					clock.Advance(2 * time.Second)
				case "count change":
					it2 := it
					it2.Limit.Requests = 2000
					redisApply(t, r, it2) // strict: the old chunk is revoked
					admitted++
				case "close":
					if err := r.Close(); err != nil {
						t.Fatal(err)
					}
				case "window end":
					clock.Advance(time.Minute)
				}
				// Redis counts the hits admitted and, after a count change,
				// the chunk granted under the new count (polled: it may be
				// on its way).
				var count float64
				var st redis.Stats
				testutil.WaitFor(t, 10*time.Second, "the chunk's return", func() bool {
					st = r.Stats()
					got := leaseState(t, srv, prefix, it)
					if len(got) < 2 {
						return false
					}
					count = got[1]
					if how == "window end" {
						count = got[2] // now the previous window's
					}
					held := st.Lease.Granted - st.Lease.Returned - st.ChunkDecided
					if how != "count change" && held != 0 {
						return false
					}
					return st.Lease.Returned > 0 && count == float64(admitted+held)
				})
				if how != "count change" && count != float64(admitted) {
					t.Fatalf("after the return Redis counts %v hits, want the %d admitted (stats %+v)", count, admitted, st.Lease)
				}
			})
		}
	}
}

// BenchmarkRedisLease: one fixed-window item (a minute's window) per
// request with consistency lease, on one hot key, 10,000 keys in turn and 10,000 keys drawn with
// Zipf s = 1.1; strict beside each for comparison. redis-cpu-µs/op is
// Redis's CPU per decision.
func BenchmarkRedisLease(b *testing.B) {
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
		for _, c := range []backend.Consistency{backend.Strict, backend.Lease} {
			b.Run(sc.name+"/"+c.String(), func(b *testing.B) {
				l := bigLimit(algorithms.FixedWindow)
				l.Window = time.Minute // as make bench's
				benchRedisConsistency(b, redis.Options{}, l, sc.key, c)
			})
		}
	}
}

// TestLeaseBucketHeldTokens: a bucket's chunk holds its tokens in Redis
// (they do not refill while held), and Close settles them: the tokens used
// become debt, the unused ones go back, and nothing stays held.
func TestLeaseBucketHeldTokens(t *testing.T) {
	srv := redistest.StartStandalone(t)
	for _, alg := range []algorithms.Kind{algorithms.TokenBucket, algorithms.GCRA} {
		t.Run(alg.String(), func(t *testing.T) {
			clock := testutil.NewClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
			prefix := fmt.Sprintf("held-%d:", time.Now().UnixNano())
			r, err := redis.NewWithClock(redis.Options{URL: srv.URL(), KeyPrefix: prefix, LeaseMinChunk: 20}, clock)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			l := algorithms.Limit{Algorithm: alg, Requests: 1000, Window: time.Minute}
			it := backend.Item{Key: "b", Limit: l, Hits: 1, Partition: 9, Consistency: backend.Lease}
			admitted := uint64(0)
			testutil.WaitFor(t, 10*time.Second, "a chunk", func() bool {
				if r.Stats().Lease.Granted > 0 {
					return true
				}
				redisApply(t, r, it)
				admitted++
				return false
			})
			for range 5 {
				redisApply(t, r, it)
				admitted++
			}
			// Held: at least the chunk's tokens not taken (and those taken
			// since the last refill said); with the debt (what refills),
			// every token admitted or in the chunk.
			// (Polled: a refill asked for by the last requests may be on
			// its way.)
			w := float64(l.Window.Microseconds())
			var f []float64
			var avail float64
			testutil.WaitFor(t, 10*time.Second, "held + debt = admitted + the chunk's tokens left", func() bool {
				st := r.Stats()
				f = leaseState(t, srv, prefix, it)
				avail = float64(st.Lease.Granted - st.ChunkDecided)
				return len(f) == 4 && f[2] >= avail && f[2]+f[1]/w == float64(admitted)+avail && r.Stats().Lease == st.Lease
			})
			if err := r.Close(); err != nil {
				t.Fatal(err)
			}
			f = leaseState(t, srv, prefix, it)
			if len(f) != 2 || f[1] != float64(admitted)*w {
				t.Fatalf("after Close the state is %v, want no tokens held and the debt of the %d admitted (%v)", f, admitted, float64(admitted)*w)
			}
		})
	}
}

// TestLeaseWindowEndOfManyKeys: at a window's end of more keys than the
// refill queue holds (6,000 sliding counters with plenty left), every
// chunk's unused hits go back (none stranded) and every key gets its next
// window's chunk: the sweeper sends its returns and renewals itself.
func TestLeaseWindowEndOfManyKeys(t *testing.T) {
	srv := redistest.StartStandalone(t)
	clock := testutil.NewClock(time.Date(2030, 1, 1, 0, 0, 50, 0, time.UTC))
	r := newClockedRedisStore(t, clock, redis.Options{URL: srv.URL(), KeyPrefix: fmt.Sprintf("ends-%d:", time.Now().UnixNano())})
	const n = 6000
	l := algorithms.Limit{Algorithm: algorithms.SlidingWindowCounter, Requests: 1_000_000_000, Window: time.Minute}
	item := func(i int) backend.Item {
		return backend.Item{Key: fmt.Sprintf("k%d", i), Limit: l, Hits: 1, Partition: uint64(i + 1), Consistency: backend.Lease}
	}
	for i := range n {
		redisApply(t, r, item(i)) // strict: its chunk follows
	}
	testutil.WaitFor(t, 20*time.Second, "a chunk for every key", func() bool { return r.Stats().Lease.Chunks >= n })
	before := r.Stats().Lease
	clock.Advance(15 * time.Second) // past the minute's end
	var after redis.LeaseStats
	testutil.WaitFor(t, 20*time.Second, "returns and renewals", func() bool {
		after = r.Stats().Lease
		return after.Chunks-before.Chunks >= n && after.Returned > before.Returned
	})
	if d := after.Stranded - before.Stranded; d != 0 {
		t.Errorf("%d hits stranded at the window's end (lease %+v)", d, after)
	}
	if back, held := after.Returned-before.Returned, before.Granted-before.Returned; back != held {
		t.Errorf("%d hits returned at the window's end, want the %d held", back, held)
	}
}

// TestLeaseKeysMakeRoom: with LeaseKeys all held by chunks kept because
// plenty remains, a new key is strict; once those keys have been idle a
// while (20 s) their chunks go back and they are forgotten, and the new key
// gets a chunk.
func TestLeaseKeysMakeRoom(t *testing.T) {
	srv := redistest.StartStandalone(t)
	clock := testutil.NewClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	r := newClockedRedisStore(t, clock, redis.Options{URL: srv.URL(), KeyPrefix: fmt.Sprintf("room-%d:", time.Now().UnixNano()), LeaseKeys: 10})
	l := algorithms.Limit{Algorithm: algorithms.FixedWindow, Requests: 1_000_000_000, Window: time.Hour}
	item := func(k string) backend.Item {
		return backend.Item{Key: k, Limit: l, Hits: 1, Partition: 1, Consistency: backend.Lease}
	}
	for i := range 10 {
		redisApply(t, r, item(fmt.Sprint("old", i)))
	}
	testutil.WaitFor(t, 10*time.Second, "chunks for the 10 keys", func() bool { return r.Stats().Lease.Chunks >= 10 })
	decided := r.Stats().ChunkDecided
	for range 20 {
		redisApply(t, r, item("new"))
	}
	if st := r.Stats(); st.ChunkDecided != decided {
		t.Fatalf("the 11th key was decided from a chunk with LeaseKeys 10 (%d)", st.ChunkDecided-decided)
	}
	clock.Advance(25 * time.Second)
	testutil.WaitFor(t, 10*time.Second, "a chunk for the new key", func() bool {
		redisApply(t, r, item("new"))
		return r.Stats().ChunkDecided > decided
	})
	if st := r.Stats().Lease; st.Returned == 0 {
		t.Errorf("the idle keys' chunks were not given back: %+v", st)
	}
}
