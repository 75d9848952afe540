package redis_test

import (
	"context"
	"testing"
	"time"

	"github.com/envoyrls/envoy-rls/internal/redistest"
	"github.com/envoyrls/envoy-rls/internal/schedprobe"
	"github.com/envoyrls/envoy-rls/internal/testutil"
	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/backend"
	"github.com/envoyrls/envoy-rls/pkg/backend/redis"
)

// TestRedisSentinelFailoverKeepsReplicatedCounts: a store on Sentinel
// charges 3 of a key's 5, the replica acknowledges the write (WAIT), and
// the master is killed. Until Sentinel promotes the replica, Apply fails
// within its deadline; afterwards the same store follows the new master by
// itself, and the key continues from the replicated count: exactly 2 more
// are allowed. (A count the replica had not received when the master died
// would be lost; that is why the test waits for the acknowledgement.)
func TestRedisSentinelFailoverKeepsReplicatedCounts(t *testing.T) {
	master := redistest.StartStandalone(t)
	replica := redistest.StartReplica(t, master)
	sentinel := redistest.StartFailoverSentinel(t, master, "rls", replica)
	r := newRedisStore(t, redis.Options{SentinelAddrs: []string{sentinel.Addr()}, SentinelMaster: "rls"})

	limit := algorithms.Limit{Algorithm: algorithms.FixedWindow, Requests: 5, Window: time.Hour}
	key := "{sentinel}kept"
	for i := 0; i < 3; i++ {
		if _, allowed := redisApply(t, r, backend.Item{Key: key, Limit: limit, Hits: 1}); !allowed {
			t.Fatalf("hit %d of 5 denied", i+1)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if n, err := master.Client().Do(ctx, "WAIT", 1, 5000).Int(); err != nil || n != 1 {
		t.Fatalf("WAIT for the replica: %d acknowledged, error %v", n, err)
	}

	master.Stop()
	// No master: Apply fails, within its deadline plus slack.
	const timeout = 200 * time.Millisecond
	probe := []backend.Item{{Key: "{sentinel}probe", Limit: algorithms.Limit{Algorithm: algorithms.TokenBucket, Requests: 1 << 40, Window: time.Second}, Hits: 1}}
	out := make([]algorithms.Decision, 1)
	for i := 0; i < 3; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		sched := schedprobe.Start()
		start := time.Now()
		_, err := r.Apply(ctx, probe, out)
		took, slack := time.Since(start), sched.Stop()
		cancel()
		if err == nil {
			t.Fatalf("Apply succeeded with the master killed and no replica promoted yet")
		}
		if took > timeout+slack {
			t.Errorf("Apply without a master took %v, deadline %v (measured scheduling slack %v: probe %v late at worst, goroutines waited up to %v to run, threads %v for a CPU)",
				took, timeout, slack, sched.Worst(), sched.SchedMax(), sched.RunDelay())
		}
	}

	redistest.WaitPromoted(t, sentinel, "rls", replica, 20*time.Second)
	testutil.WaitFor(t, 10*time.Second, "the store reaches the promoted replica", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		_, err := r.Apply(ctx, probe, out)
		return err == nil
	})

	allowed := 0
	var last algorithms.Decision
	for i := 0; i < 10; i++ {
		d, ok := redisApply(t, r, backend.Item{Key: key, Limit: limit, Hits: 1})
		if ok {
			allowed++
			last = d[0]
		}
	}
	if allowed != 2 {
		t.Errorf("after the failover %d more allowed, want 2 (3 of 5 were replicated)", allowed)
	}
	if last.Remaining != 0 {
		t.Errorf("last allowed hit reports %d remaining, want 0", last.Remaining)
	}
	if n, err := replica.Client().Exists(ctx, "{sentinel}kept").Result(); err != nil || n != 1 {
		t.Errorf("key on the promoted replica: exists %d, error %v", n, err)
	}
}
