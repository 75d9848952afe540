package redis_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/envoyrls/envoy-rls/internal/redistest"
	"github.com/envoyrls/envoy-rls/internal/schedprobe"
	"github.com/envoyrls/envoy-rls/internal/testutil"
	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/backend"
	"github.com/envoyrls/envoy-rls/pkg/backend/memory"
	"github.com/envoyrls/envoy-rls/pkg/backend/redis"
)

// One 3-master cluster serves every cluster test of the package: starting
// one takes a second or two.
func TestRedisCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	t.Run("Slot", func(t *testing.T) { testClusterSlot(t, cl) })
	t.Run("Exact", func(t *testing.T) { testClusterExact(t, cl) })
	t.Run("Split", func(t *testing.T) { testClusterSplit(t, cl) })
	t.Run("RefundSharedLimit", func(t *testing.T) { testClusterRefundSharedLimit(t, cl) })
	t.Run("RefundConcurrent", func(t *testing.T) { testClusterRefundConcurrent(t, cl) })
	t.Run("RefundOutlivesCaller", func(t *testing.T) { testClusterRefundOutlivesCaller(t, cl) })
	t.Run("EveryKeyHasATTL", func(t *testing.T) { testClusterEveryKeyHasATTL(t, cl) })
	t.Run("MatchesMemory", func(t *testing.T) { testClusterMatchesMemory(t, cl) })
	t.Run("MatchesSplitModel", func(t *testing.T) { testClusterMatchesSplitModel(t, cl) })
	t.Run("LeaseNeverExceeds", func(t *testing.T) { testLeaseNeverExceeds(t, redis.Options{ClusterAddrs: cl.Addrs()}) })
	t.Run("LeaseBatch", func(t *testing.T) { testLeaseBatch(t, redis.Options{ClusterAddrs: cl.Addrs()}, cl.Client(t), cl.Nodes) })
	// Last: it freezes a node.
	t.Run("FrozenMasterChargesOnce", func(t *testing.T) { testClusterFrozenMasterChargesOnce(t, cl) })
}

// testClusterSlot checks Slot, and the keys the store derives from
// partitions, against the cluster itself.
func testClusterSlot(t *testing.T, cl *redistest.Cluster) {
	c := cl.Client(t)
	ctx := context.Background()
	keys := []string{"", "a", "abc", "{", "}", "{}", "{}x", "x{}", "{a}", "x{a}y", "{a}{b}", "{{a}}", "a{b{c}d}", "user:{1000}:x", "\xff\xfe{\x00}"}
	for i := 0; i < 200; i++ {
		keys = append(keys, fmt.Sprintf("key-%d", i), redis.RedisKey("p:", backend.Item{Key: "rest", Partition: uint64(i) * 0x9e3779b97f4a7c15}))
	}
	for _, k := range keys {
		want, err := c.ClusterKeySlot(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got := redis.Slot(k); int64(got) != want {
			t.Errorf("Slot(%q) = %d, CLUSTER KEYSLOT says %d", k, got, want)
		}
	}
	// The derived keys are injective and keep the partition's slot
	// whatever the Key holds; without a partition, the key is prefix+Key.
	seen := map[string]backend.Item{}
	for _, p := range []uint64{1, 2, 0x7b, 0x7d, 1 << 63, ^uint64(0)} {
		for _, key := range []string{"", "b", "}b", "{b}", "x{y}", "{"} {
			it := backend.Item{Key: key, Partition: p}
			k := redis.RedisKey("p:", it)
			if prev, dup := seen[k]; dup {
				t.Errorf("items %+v and %+v share the key %q", prev, it, k)
			}
			seen[k] = it
			if redis.Slot(k) != redis.Slot(redis.RedisKey("p:", backend.Item{Partition: p})) {
				t.Errorf("item %+v left its partition's slot", it)
			}
		}
	}
	if k := redis.RedisKey("p:", backend.Item{Key: "x{y}"}); k != "p:x{y}" {
		t.Errorf("key without a partition: %q, want p:x{y}", k)
	}
}

// testClusterExact: three stores on the cluster, 120 clients, one
// hash-tagged key of limit L: exactly L allowed; and requests of two keys in
// different slots never let either key exceed its limit.
func testClusterExact(t *testing.T, cl *redistest.Cluster) {
	const L = 100
	var stores []backend.Store
	for i := 0; i < 3; i++ {
		stores = append(stores, newRedisStore(t, redis.Options{ClusterAddrs: cl.Addrs(), KeyPrefix: "exact:", PoolSize: 4}))
	}
	for _, k := range algorithms.Kinds() {
		key, part := "k-"+k.String(), uint64(k)+1
		l := longLimit(k, L)
		got := hammer(t, stores, 120, 3, func(int, int) []backend.Item {
			return []backend.Item{{Key: key, Limit: l, Hits: 1, Partition: part}}
		})
		if got != L {
			t.Fatalf("%s: allowed %d requests, want exactly %d", k, got, L)
		}
	}

	// Two slots: a limits 60, b limits 80; a request takes one of each.
	a, b := partitionsOnTwoNodes(t)
	la, lb := longLimit(algorithms.FixedWindow, 60), longLimit(algorithms.FixedWindow, 80)
	ia, ib := backend.Item{Key: "a", Limit: la, Partition: a}, backend.Item{Key: "b", Limit: lb, Partition: b}
	got := hammer(t, stores, 120, 2, func(int, int) []backend.Item {
		return []backend.Item{hit(ia, 1), hit(ib, 1)}
	})
	// Each slot charges its key whenever its own item allows, and a denied
	// request's charges are refunded: a and b hold the charges of the
	// allowed requests only, never more than a's limit. (Fewer than 60 may
	// be allowed: until a refund lands, concurrent requests see the charge.)
	ds, _ := redisApply(t, stores[0], ia, ib)
	usedA, usedB := 60-int64(ds[0].Remaining), 80-int64(ds[1].Remaining)
	if got == 0 || got > 60 || usedA != got || usedB != got {
		t.Fatalf("split requests: allowed %d, a charged %d of 60, b charged %d of 80; want each the allowed ones", got, usedA, usedB)
	}
	t.Logf("split requests: allowed %d of 240 (a and b charged %d)", got, got)
}

// partitionsOnTwoNodes returns two partitions whose slots are served by
// different masters of a 3-master cluster made by redistest.
func partitionsOnTwoNodes(t *testing.T) (uint64, uint64) {
	t.Helper()
	node := func(p uint64) int {
		s := redis.Slot(redis.RedisKey("", backend.Item{Partition: p}))
		for i := 0; i < 3; i++ {
			if lo, hi := redistest.SlotRange(i, 3); s >= lo && s <= hi {
				return i
			}
		}
		return -1
	}
	a := uint64(1)
	for b := uint64(2); b < 100; b++ {
		if node(b) != node(a) {
			return a, b
		}
	}
	t.Fatal("no two partitions on different nodes")
	return 0, 0
}

// hit returns it with hits hits.
func hit(it backend.Item, hits uint64) backend.Item {
	it.Hits = hits
	return it
}

// testClusterSplit pins the documented semantics of a request split across
// slots: allowed requests charge exactly; a denied one charges nothing but
// usage accounting, at the cost of a refund's round trip; one slot stays
// all-or-nothing in one round trip.
func testClusterSplit(t *testing.T, cl *redistest.Cluster) {
	clock := testutil.NewClock(testutil.Base)
	r := newClockedRedisStore(t, clock, redis.Options{ClusterAddrs: cl.Addrs(), KeyPrefix: "split:"})
	a, b := partitionsOnTwoNodes(t)
	one := algorithms.Limit{Requests: 1, Window: time.Second}
	five := algorithms.Limit{Requests: 5, Window: time.Second}
	ka := backend.Item{Key: "x", Limit: one, Partition: a}
	kb := backend.Item{Key: "y", Limit: five, Partition: b}
	ka2 := backend.Item{Key: "z", Limit: five, Partition: a}

	ds, ok := redisApply(t, r, hit(ka, 1), hit(kb, 1))
	if !ok || ds[0].Remaining != 0 || ds[1].Remaining != 4 {
		t.Fatalf("first split request: %v %+v", ok, ds)
	}
	before := r.Stats()
	ds, ok = redisApply(t, r, hit(ka, 1), hit(kb, 1))
	if ok || ds[0].Allowed || !ds[1].Allowed || ds[1].Remaining != 4 {
		t.Fatalf("denied split request: %v %+v; want a denied, b refunded (4 remaining)", ok, ds)
	}
	st := r.Stats()
	if st.ScriptCalls != before.ScriptCalls+3 || st.RoundTrips != before.RoundTrips+2 || st.Refunds != before.Refunds+1 {
		t.Fatalf("a denied request over two slots cost %d script calls in %d round trips, %d refunds; want 3 in 2, 1",
			st.ScriptCalls-before.ScriptCalls, st.RoundTrips-before.RoundTrips, st.Refunds-before.Refunds)
	}
	if ds, _ := redisApply(t, r, kb); ds[0].Remaining != 4 {
		t.Fatalf("b after the denied split request: %+v, want 4 remaining (refunded)", ds[0])
	}
	// An allowed split request: one round trip, no refund.
	before = r.Stats()
	if _, ok := redisApply(t, r, hit(ka2, 1), hit(kb, 1)); !ok {
		t.Fatal("split request on free keys denied")
	}
	if st := r.Stats(); st.RoundTrips != before.RoundTrips+1 || st.Refunds != before.Refunds {
		t.Fatalf("an allowed split request cost %d round trips, %d refunds; want 1, 0",
			st.RoundTrips-before.RoundTrips, st.Refunds-before.Refunds)
	}
	// One slot: all or nothing, in one round trip.
	before = r.Stats()
	ds, ok = redisApply(t, r, hit(ka, 1), hit(ka2, 1))
	if ok || !ds[1].Allowed || ds[1].Remaining != 4 {
		t.Fatalf("denied one-slot request: %v %+v; want a2 uncharged (4 remaining)", ok, ds)
	}
	if st := r.Stats(); st.RoundTrips != before.RoundTrips+1 || st.ScriptCalls != before.ScriptCalls+1 || st.Refunds != before.Refunds {
		t.Fatalf("a denied one-slot request cost %d script calls in %d round trips, %d refunds; want 1 in 1, 0",
			st.ScriptCalls-before.ScriptCalls, st.RoundTrips-before.RoundTrips, st.Refunds-before.Refunds)
	}
	if ds, _ := redisApply(t, r, ka2); ds[0].Remaining != 4 {
		t.Fatalf("a2 after the denied one-slot request: %+v, want 4 remaining", ds[0])
	}
	// A Shadow denial in another slot denies nothing and charges the rest.
	ds, ok = redisApply(t, r, hit(ka2, 1), backend.Item{Key: kb.Key, Limit: five, Hits: 9, Mode: backend.Shadow, Partition: b})
	if !ok || ds[0].Remaining != 3 || ds[1].Allowed {
		t.Fatalf("shadow denial in another slot: %v %+v", ok, ds)
	}
}

// testClusterMatchesMemory: with every item in one partition, the cluster
// store decides exactly like the memory store.
func testClusterMatchesMemory(t *testing.T, cl *redistest.Cluster) {
	rng := rand.New(rand.NewPCG(5, 6))
	clock := testutil.NewClock(time.Date(2031, 3, 4, 5, 6, 7, 0, time.UTC))
	mem := memory.New(memory.WithClock(clock), memory.WithSweepInterval(0))
	t.Cleanup(func() { mem.Close() })
	red := newClockedRedisStore(t, clock, redis.Options{ClusterAddrs: cl.Addrs(), KeyPrefix: "mem:"})
	limits := randomLimits(rng, 0, true, 6)
	for step := 0; step < 300; step++ {
		clock.Advance(time.Duration(rng.IntN(1500)) * time.Millisecond)
		items := randomItems(rng, limits)
		for i := range items {
			items[i].Partition = 1
		}
		want, wantOK := redisApply(t, mem, items...)
		got, gotOK := redisApply(t, red, items...)
		sameDecisions(t, step, items, got, gotOK, want, wantOK)
	}
}

// testClusterMatchesSplitModel: keys in three partitions (so requests span
// one to three slots) decide exactly like the model of split requests.
func testClusterMatchesSplitModel(t *testing.T, cl *redistest.Cluster) {
	rng := rand.New(rand.NewPCG(7, 8))
	clock := testutil.NewClock(time.Date(2031, 3, 4, 5, 6, 7, 0, time.UTC))
	md := redisModel{}
	const prefix = "model:"
	red := newClockedRedisStore(t, clock, redis.Options{ClusterAddrs: cl.Addrs(), KeyPrefix: prefix})
	limits := randomLimits(rng, 0, true, 6)
	split := 0
	for step := 0; step < 400; step++ {
		clock.Advance(time.Duration(rng.IntN(1500)) * time.Millisecond)
		items := randomItems(rng, limits)
		slots := map[int]bool{}
		for i := range items {
			// Each key keeps one partition, as a descriptor's limits do.
			items[i].Partition = uint64(items[i].Key[1]-'0')%3 + 1
			slots[redis.Slot(redis.RedisKey(prefix, items[i]))] = true
		}
		if len(slots) > 1 {
			split++
		}
		want, wantOK := md.applySplit(items, clock.Now(), prefix)
		got, gotOK := redisApply(t, red, items...)
		sameDecisions(t, step, items, got, gotOK, want, wantOK)
	}
	if split < 50 {
		t.Fatalf("only %d requests spanned several slots", split)
	}
}

// partitionOnOtherSlot returns a partition whose slot is neither of the
// slots of partitions a and b.
func partitionOnOtherSlot(t *testing.T, a, b uint64) uint64 {
	t.Helper()
	slot := func(p uint64) int { return redis.Slot(redis.RedisKey("", backend.Item{Partition: p})) }
	for c := uint64(100); c < 200; c++ {
		if slot(c) != slot(a) && slot(c) != slot(b) {
			return c
		}
	}
	t.Fatal("no third slot")
	return 0
}

// testClusterRefundSharedLimit: user A's requests take A's own limit and a
// limit shared with user B, in another slot, plus a usage charge. Once A's
// own limit is spent, A's requests are denied by A's slot: the shared
// limit's slot, which allowed, is refunded (one more round trip each), so
// B still gets the whole shared limit, on every algorithm, on a test's
// clock and on Redis's. The usage charges stay. A denied request of one
// slot costs one round trip and no refund.
func testClusterRefundSharedLimit(t *testing.T, cl *redistest.Cluster) {
	pa, ps := partitionsOnTwoNodes(t)
	pb := partitionOnOtherSlot(t, pa, ps)
	const shared, denied = 10, 20
	for _, clocked := range []bool{true, false} {
		var r *redis.Store
		if clocked {
			r = newClockedRedisStore(t, testutil.NewClock(testutil.Base), redis.Options{ClusterAddrs: cl.Addrs(), KeyPrefix: "refund-c:"})
		} else {
			r = newRedisStore(t, redis.Options{ClusterAddrs: cl.Addrs(), KeyPrefix: "refund-r:"})
		}
		for _, k := range algorithms.Kinds() {
			name := fmt.Sprintf("%s/clock=%t", k, clocked)
			userA := backend.Item{Key: "a:" + k.String(), Limit: longLimit(k, 1), Hits: 1, Partition: pa}
			userB := backend.Item{Key: "b:" + k.String(), Limit: longLimit(k, 1000), Hits: 1, Partition: pb}
			sh := backend.Item{Key: "shared:" + k.String(), Limit: longLimit(k, shared), Hits: 1, Partition: ps}
			usage := backend.Item{Key: "usage:" + k.String(), Limit: longLimit(k, 1000), Hits: 3, Partition: ps, Account: true}
			if _, ok := redisApply(t, r, userA, sh, usage); !ok {
				t.Fatalf("%s: A's first request denied", name)
			}
			before := r.Stats()
			for i := 0; i < denied; i++ {
				ds, ok := redisApply(t, r, userA, sh, usage)
				if ok || ds[0].Allowed || !ds[1].Allowed || ds[1].Remaining != shared-1 {
					t.Fatalf("%s: A's denied request %d: %v %+v; want A denied, the shared limit refunded (%d left)", name, i, ok, ds, shared-1)
				}
			}
			st := r.Stats()
			if st.Refunds != before.Refunds+denied || st.RefundsFailed != before.RefundsFailed || st.RoundTrips != before.RoundTrips+2*denied {
				t.Fatalf("%s: %d denied requests over two slots: %d refunds (%d failed) in %d round trips; want %d in %d",
					name, denied, st.Refunds-before.Refunds, st.RefundsFailed-before.RefundsFailed, st.RoundTrips-before.RoundTrips, denied, 2*denied)
			}
			// A's usage charges stay: 3 hits per request.
			if ds, _ := redisApply(t, r, hit(usage, 0)); ds[0].Remaining != 1000-3*(denied+1) {
				t.Fatalf("%s: usage after %d requests: %+v, want %d left (never refunded)", name, denied+1, ds[0], 1000-3*(denied+1))
			}
			// B gets the rest of the shared limit, exactly.
			allowed := 0
			for i := 0; i < shared+5; i++ {
				if _, ok := redisApply(t, r, userB, sh); ok {
					allowed++
				}
			}
			if allowed != shared-1 {
				t.Fatalf("%s: B was allowed %d requests on the shared limit after A's denied ones, want %d", name, allowed, shared-1)
			}
			// One slot: A's own key and a key of A's slot, denied in one
			// round trip, nothing to refund.
			before = r.Stats()
			own := backend.Item{Key: "a2:" + k.String(), Limit: longLimit(k, 5), Hits: 1, Partition: pa}
			if ds, ok := redisApply(t, r, userA, own); ok || !ds[1].Allowed || ds[1].Remaining != 5 {
				t.Fatalf("%s: denied one-slot request: %v %+v", name, ok, ds)
			}
			if st := r.Stats(); st.RoundTrips != before.RoundTrips+1 || st.Refunds != before.Refunds {
				t.Fatalf("%s: a denied one-slot request cost %d round trips, %d refunds; want 1, 0", name, st.RoundTrips-before.RoundTrips, st.Refunds-before.Refunds)
			}
		}
	}
}

// testClusterRefundConcurrent: on Redis's clock, three stores, user A's
// denied cross-slot requests race user B's on a shared limit of L. Until a
// refund lands B may be denied by A's charge, but once the race is over
// the shared key holds B's charges only: B then gets the rest of L, for
// exactly L in all (token_bucket and gcra: within one token, what a
// refund may keep of a charge when another request wrote the key in
// between).
func testClusterRefundConcurrent(t *testing.T, cl *redistest.Cluster) {
	const L = 40
	pa, ps := partitionsOnTwoNodes(t)
	pb := partitionOnOtherSlot(t, pa, ps)
	var stores []backend.Store
	for i := 0; i < 3; i++ {
		stores = append(stores, newRedisStore(t, redis.Options{ClusterAddrs: cl.Addrs(), KeyPrefix: "refund-race:", PoolSize: 4}))
	}
	for _, k := range algorithms.Kinds() {
		userA := backend.Item{Key: "a:" + k.String(), Limit: longLimit(k, 1), Hits: 1, Partition: pa}
		userB := backend.Item{Key: "b:" + k.String(), Limit: longLimit(k, 1000), Hits: 1, Partition: pb}
		sh := backend.Item{Key: "shared:" + k.String(), Limit: longLimit(k, L), Hits: 1, Partition: ps}
		redisApply(t, stores[0], userA) // A's own limit is spent: A is denied from now on
		raced := hammer(t, stores, 60, 4, func(client, _ int) []backend.Item {
			if client%2 == 0 {
				return []backend.Item{userA, sh}
			}
			return []backend.Item{userB, sh}
		})
		rest := 0
		for i := 0; i < L+2; i++ {
			if _, ok := redisApply(t, stores[i%3], userB, sh); ok {
				rest++
			}
		}
		total := int(raced) + rest
		lo := L
		if k == algorithms.TokenBucket || k == algorithms.GCRA {
			lo = L - 1
		}
		if total < lo || total > L {
			t.Fatalf("%s: B was allowed %d requests during A's denied ones and %d after, %d in all; want %d..%d", k, raced, rest, total, lo, L)
		}
		t.Logf("%s: B allowed %d during the race, %d after", k, raced, rest)
	}
}

// BenchmarkRedisClusterSplit: one caller's requests of two items on a
// 3-master Cluster, sequential, so ns/op is a request's latency: allowed
// across two slots (one round trip), denied across two slots (the refund's
// second round trip), and denied on one slot (undone in its one call).
// round-trips/op counts pipelines.
func BenchmarkRedisClusterSplit(b *testing.B) {
	cl := redistest.StartCluster(b, 3)
	r := newRedisStore(b, redis.Options{ClusterAddrs: cl.Addrs(), KeyPrefix: "bsplit:"})
	pa, ps := uint64(1), uint64(2)
	for redis.Slot(redis.RedisKey("", backend.Item{Partition: ps})) == redis.Slot(redis.RedisKey("", backend.Item{Partition: pa})) {
		ps++
	}
	free := longLimit(algorithms.TokenBucket, 1<<40)
	spent := longLimit(algorithms.TokenBucket, 1)
	cases := []struct {
		name  string
		items []backend.Item
		ok    bool
	}{
		{"allowed/two-slots", []backend.Item{{Key: "a", Limit: free, Hits: 1, Partition: pa}, {Key: "s", Limit: free, Hits: 1, Partition: ps}}, true},
		{"denied/two-slots", []backend.Item{{Key: "spent", Limit: spent, Hits: 1, Partition: pa}, {Key: "s", Limit: free, Hits: 1, Partition: ps}}, false},
		{"denied/one-slot", []backend.Item{{Key: "spent", Limit: spent, Hits: 1, Partition: pa}, {Key: "a", Limit: free, Hits: 1, Partition: pa}}, false},
	}
	redisApply(b, r, backend.Item{Key: "spent", Limit: spent, Hits: 1, Partition: pa})
	ctx := context.Background()
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			out := make([]algorithms.Decision, len(c.items))
			redisApply(b, r, c.items...) // the script is loaded
			before := r.Stats()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if ok, err := r.Apply(ctx, c.items, out); err != nil || ok != c.ok {
					b.Fatalf("%v %v, want %v", ok, err, c.ok)
				}
			}
			st := r.Stats()
			b.ReportMetric(float64(st.RoundTrips-before.RoundTrips)/float64(b.N), "round-trips/op")
			b.ReportMetric(float64(st.Refunds-before.Refunds)/float64(b.N), "refunds/op")
		})
	}
}

// testClusterRefundOutlivesCaller: a caller whose deadline comes after its
// denied split request was answered but before the refund's round trip
// does not wait for the refund past its deadline: it gets its denial, and
// the refund lands after it left (counted then), leaving the shared limit
// whole. A batch window of W holds every call W before it is sent, so the
// answer comes at W and the refund at 2W, the deadline between them.
func testClusterRefundOutlivesCaller(t *testing.T, cl *redistest.Cluster) {
	const w = 300 * time.Millisecond
	pa, ps := partitionsOnTwoNodes(t)
	r := newRedisStore(t, redis.Options{ClusterAddrs: cl.Addrs(), KeyPrefix: "refund-late:", BatchWindow: w})
	for attempt := 0; ; attempt++ {
		userA := backend.Item{Key: fmt.Sprintf("a%d", attempt), Limit: longLimit(algorithms.FixedWindow, 1), Hits: 1, Partition: pa}
		sh := backend.Item{Key: fmt.Sprintf("shared%d", attempt), Limit: longLimit(algorithms.FixedWindow, 5), Hits: 1, Partition: ps}
		redisApply(t, r, userA)
		before := r.Stats()
		out := make([]algorithms.Decision, 2)
		const deadline = w * 3 / 2
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		probe := schedprobe.Start()
		start := time.Now()
		ok, err := r.Apply(ctx, []backend.Item{userA, sh}, out)
		took, slack := time.Since(start), probe.Stop()
		cancel()
		if err != nil {
			// The machine was too slow for the first round trip to be
			// answered by the deadline: nothing this test is about.
			if attempt == 5 {
				t.Fatalf("5 attempts: no denied request answered within %v: %v", deadline, err)
			}
			continue
		}
		if ok || out[0].Allowed || !out[1].Allowed {
			t.Fatalf("A's split request: %v %+v, want denied by A's own limit", ok, out)
		}
		if took > deadline+slack {
			t.Fatalf("a denied split request took %v, deadline %v (measured scheduling slack %v)", took, deadline, slack)
		}
		if st := r.Stats(); st.Refunds != before.Refunds {
			t.Fatalf("the refund landed before its caller left, %v after the request: the test tests nothing", took)
		}
		testutil.WaitFor(t, 10*time.Second, "the refund lands after its caller left", func() bool {
			return r.Stats().Refunds == before.Refunds+1
		})
		if ds, _ := redisApply(t, r, hit(sh, 0)); ds[0].Remaining != 5 || r.Stats().RefundsFailed != before.RefundsFailed {
			t.Fatalf("the shared limit after the late refund: %+v, %d failed refunds; want 5 left", ds[0], r.Stats().RefundsFailed-before.RefundsFailed)
		}
		return
	}
}
