package redis_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/envoyrls/envoy-rls/internal/redistest"
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
	t.Run("MatchesMemory", func(t *testing.T) { testClusterMatchesMemory(t, cl) })
	t.Run("MatchesSplitModel", func(t *testing.T) { testClusterMatchesSplitModel(t, cl) })
}

// testClusterSlot checks Slot and HashTagged against the cluster itself.
func testClusterSlot(t *testing.T, cl *redistest.Cluster) {
	c := cl.Client(t)
	ctx := context.Background()
	keys := []string{"", "a", "abc", "{", "}", "{}", "{}x", "x{}", "{a}", "x{a}y", "{a}{b}", "{{a}}", "a{b{c}d}", "user:{1000}:x", "\xff\xfe{\x00}"}
	for i := 0; i < 200; i++ {
		keys = append(keys, fmt.Sprintf("key-%d", i), redis.HashTagged(fmt.Sprint(i), "rest"))
	}
	for _, tag := range []string{"", "a", "{", "}", "%", "a}b", "{x}", "%7D"} {
		keys = append(keys, redis.HashTagged(tag, "r"))
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
	// HashTagged is injective and keeps the tag's slot whatever rest holds.
	seen := map[string][2]string{}
	for _, tag := range []string{"", "a", "a}", "a}b", "%", "%25", "{", "%7B", "}"} {
		for _, rest := range []string{"", "b", "}b", "x{y}"} {
			k := redis.HashTagged(tag, rest)
			if prev, dup := seen[k]; dup {
				t.Errorf("HashTagged(%q, %q) = HashTagged(%q, %q) = %q", tag, rest, prev[0], prev[1], k)
			}
			seen[k] = [2]string{tag, rest}
			if redis.Slot(k) != redis.Slot(redis.HashTagged(tag, "")) {
				t.Errorf("HashTagged(%q, %q) left the tag's slot", tag, rest)
			}
		}
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
		key := redis.HashTagged("d-"+k.String(), "k")
		l := longLimit(k, L)
		got := hammer(t, stores, 120, 3, func(int, int) []backend.Item {
			return []backend.Item{{Key: key, Limit: l, Hits: 1}}
		})
		if got != L {
			t.Fatalf("%s: allowed %d requests, want exactly %d", k, got, L)
		}
	}

	// Two slots: a limits 60, b limits 80; a request takes one of each.
	a, b := tagsOnTwoNodes(t)
	ka, kb := redis.HashTagged(a, "a"), redis.HashTagged(b, "b")
	la, lb := longLimit(algorithms.FixedWindow, 60), longLimit(algorithms.FixedWindow, 80)
	got := hammer(t, stores, 120, 2, func(int, int) []backend.Item {
		return []backend.Item{{Key: ka, Limit: la, Hits: 1}, {Key: kb, Limit: lb, Hits: 1}}
	})
	// Each slot charges its key whenever its own item allows, even when the
	// other slot denies: a denied split request may be over-charged, so
	// fewer than 60 may be allowed, but no key ever exceeds its limit and
	// every allowed request was charged on both.
	ds, _ := redisApply(t, stores[0], backend.Item{Key: ka, Limit: la}, backend.Item{Key: kb, Limit: lb})
	usedA, usedB := 60-int64(ds[0].Remaining), 80-int64(ds[1].Remaining)
	if got > 60 || usedA != 60 || usedB < got || usedB > 80 {
		t.Fatalf("split requests: allowed %d, a charged %d of 60, b charged %d of 80", got, usedA, usedB)
	}
	t.Logf("split requests: allowed %d of 240 (a 60/60, b %d/80)", got, usedB)
}

// tagsOnTwoNodes returns two hash tags whose slots are served by different
// masters of a 3-master cluster made by redistest.
func tagsOnTwoNodes(t *testing.T) (string, string) {
	t.Helper()
	node := func(tag string) int {
		s := redis.Slot(redis.HashTagged(tag, ""))
		for i := 0; i < 3; i++ {
			if lo, hi := redistest.SlotRange(i, 3); s >= lo && s <= hi {
				return i
			}
		}
		return -1
	}
	a := "tag-0"
	for i := 1; i < 100; i++ {
		if b := fmt.Sprintf("tag-%d", i); node(b) != node(a) {
			return a, b
		}
	}
	t.Fatal("no two tags on different nodes")
	return "", ""
}

// testClusterSplit pins the documented semantics of a request split across
// slots: allowed requests charge exactly; a denied one charges the slots
// whose own Enforced items allowed; one slot stays all-or-nothing.
func testClusterSplit(t *testing.T, cl *redistest.Cluster) {
	clock := testutil.NewClock(testutil.Base)
	r := newRedisStore(t, redis.Options{ClusterAddrs: cl.Addrs(), Clock: clock, KeyPrefix: "split:"})
	a, b := tagsOnTwoNodes(t)
	one := algorithms.Limit{Requests: 1, Window: time.Second}
	five := algorithms.Limit{Requests: 5, Window: time.Second}
	ka, kb, ka2 := redis.HashTagged(a, "x"), redis.HashTagged(b, "y"), redis.HashTagged(a, "z")

	ds, ok := redisApply(t, r, backend.Item{Key: ka, Limit: one, Hits: 1}, backend.Item{Key: kb, Limit: five, Hits: 1})
	if !ok || ds[0].Remaining != 0 || ds[1].Remaining != 4 {
		t.Fatalf("first split request: %v %+v", ok, ds)
	}
	before := r.Stats()
	ds, ok = redisApply(t, r, backend.Item{Key: ka, Limit: one, Hits: 1}, backend.Item{Key: kb, Limit: five, Hits: 1})
	if ok || ds[0].Allowed || !ds[1].Allowed || ds[1].Remaining != 3 {
		t.Fatalf("denied split request: %v %+v; want a denied, b charged (3 remaining)", ok, ds)
	}
	if st := r.Stats(); st.ScriptCalls != before.ScriptCalls+2 || st.RoundTrips != before.RoundTrips+1 {
		t.Fatalf("a request over two slots cost %d script calls in %d round trips; want 2 in 1",
			st.ScriptCalls-before.ScriptCalls, st.RoundTrips-before.RoundTrips)
	}
	if ds, _ := redisApply(t, r, backend.Item{Key: kb, Limit: five}); ds[0].Remaining != 3 {
		t.Fatalf("b after the denied split request: %+v, want 3 remaining (over-charged)", ds[0])
	}
	// One slot: all or nothing.
	ds, ok = redisApply(t, r, backend.Item{Key: ka, Limit: one, Hits: 1}, backend.Item{Key: ka2, Limit: five, Hits: 1})
	if ok || !ds[1].Allowed || ds[1].Remaining != 5 {
		t.Fatalf("denied one-slot request: %v %+v; want a2 uncharged (5 remaining)", ok, ds)
	}
	if ds, _ := redisApply(t, r, backend.Item{Key: ka2, Limit: five}); ds[0].Remaining != 5 {
		t.Fatalf("a2 after the denied one-slot request: %+v, want 5 remaining", ds[0])
	}
	// A Shadow denial in another slot denies nothing and charges the rest.
	ds, ok = redisApply(t, r, backend.Item{Key: ka2, Limit: five, Hits: 1}, backend.Item{Key: kb, Limit: five, Hits: 9, Mode: backend.Shadow})
	if !ok || ds[0].Remaining != 4 || ds[1].Allowed {
		t.Fatalf("shadow denial in another slot: %v %+v", ok, ds)
	}
}

// testClusterMatchesMemory: with every key under one hash tag, the cluster
// store decides exactly like Memory.
func testClusterMatchesMemory(t *testing.T, cl *redistest.Cluster) {
	rng := rand.New(rand.NewPCG(5, 6))
	clock := testutil.NewClock(time.Date(2031, 3, 4, 5, 6, 7, 0, time.UTC))
	mem := memory.New(memory.WithClock(clock), memory.WithSweepInterval(0))
	t.Cleanup(func() { mem.Close() })
	red := newRedisStore(t, redis.Options{ClusterAddrs: cl.Addrs(), Clock: clock, KeyPrefix: "mem:"})
	limits := randomLimits(rng, 0, true, 6)
	for step := 0; step < 300; step++ {
		clock.Advance(time.Duration(rng.IntN(1500)) * time.Millisecond)
		items := randomItems(rng, limits)
		for i := range items {
			items[i].Key = redis.HashTagged("one", items[i].Key)
		}
		want, wantOK := redisApply(t, mem, items...)
		got, gotOK := redisApply(t, red, items...)
		sameDecisions(t, step, items, got, gotOK, want, wantOK)
	}
}

// testClusterMatchesSplitModel: keys under three tags (so requests span
// one to three slots) decide exactly like the model of split requests.
func testClusterMatchesSplitModel(t *testing.T, cl *redistest.Cluster) {
	rng := rand.New(rand.NewPCG(7, 8))
	clock := testutil.NewClock(time.Date(2031, 3, 4, 5, 6, 7, 0, time.UTC))
	md := redisModel{}
	const prefix = "model:"
	red := newRedisStore(t, redis.Options{ClusterAddrs: cl.Addrs(), Clock: clock, KeyPrefix: prefix})
	limits := randomLimits(rng, 0, true, 6)
	tags := []string{"x", "y", "z"}
	split := 0
	for step := 0; step < 400; step++ {
		clock.Advance(time.Duration(rng.IntN(1500)) * time.Millisecond)
		items := randomItems(rng, limits)
		slots := map[int]bool{}
		for i := range items {
			// Each key keeps one tag, as a descriptor's limits do.
			items[i].Key = redis.HashTagged(tags[int(items[i].Key[1]-'0')%3], items[i].Key)
			slots[redis.Slot(prefix+items[i].Key)] = true
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
