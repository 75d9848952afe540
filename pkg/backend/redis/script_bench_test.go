package redis

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/envoyrls/envoy-rls/internal/redistest"
	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/backend"
)

// floorLibrary is the least a read-modify-write decision can do in a
// script: TIME once per call, then GET and SET ... PX of every key.
const floorLibrary = `#!lua name=envoyrls_bench_floor
redis.register_function('envoyrls_bench_floor', function(keys, args)
	local t = redis.call('TIME')
	for i = 1, #keys do
		redis.call('GET', keys[i])
		redis.call('SET', keys[i], args[1], 'PX', 1000)
	end
	return {}
end)
`

// scriptCost reads the time spent in FCALL (INFO commandstats) and the
// redis-server's CPU, in µs.
func scriptCost(b *testing.B, rc *goredis.Client) (cmd, cpu float64) {
	b.Helper()
	txt, err := rc.Info(context.Background(), "commandstats", "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(txt, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		switch {
		case !ok:
		case k == "cmdstat_fcall":
			for _, kv := range strings.Split(v, ",") {
				if a, x, _ := strings.Cut(kv, "="); a == "usec" {
					f, _ := strconv.ParseFloat(x, 64)
					cmd += f
				}
			}
		case k == "used_cpu_user" || k == "used_cpu_sys":
			f, _ := strconv.ParseFloat(v, 64)
			cpu += f * 1e6
		}
	}
	return cmd, cpu
}

// BenchmarkRedisScript measures the script alone on a redis-server: one
// goroutine sends FCALLs eight to a pipeline, each of one request
// ("single") or of 32 requests on distinct keys ("batched"), one
// single-item decision per request, on 10,000 keys (the sliding log at a
// limit of 1,000 per second on 16 keys, so each key holds hundreds of
// entries). redis-µs/decision is FCALL's time in INFO commandstats,
// redis-cpu-µs/decision the redis-server's CPU (which adds reading and
// answering the pipeline). "floor" is a script that only reads TIME and
// does GET and SET ... PX of each key. Without the store's concurrent
// callers on the same CPUs, these are the figures least disturbed by a
// busy machine.
func BenchmarkRedisScript(b *testing.B) {
	srv := redistest.StartStandalone(b)
	rc := srv.Client()
	ctx := context.Background()
	if err := rc.FunctionLoad(ctx, libraryCode).Err(); err != nil {
		b.Fatal(err)
	}
	if err := rc.FunctionLoad(ctx, floorLibrary).Err(); err != nil {
		b.Fatal(err)
	}
	for i := -1; i < len(algorithms.Kinds()); i++ {
		floor, k, name := i < 0, algorithms.FixedWindow, "floor"
		if !floor {
			k = algorithms.Kinds()[i]
			name = k.String()
		}
		for _, per := range []int{1, 32} {
			mode := "single"
			if per > 1 {
				mode = fmt.Sprintf("batched%d", per)
			}
			b.Run(name+"/"+mode, func(b *testing.B) { benchScript(b, rc, k, floor, per) })
		}
	}
}

func benchScript(b *testing.B, rc *goredis.Client, k algorithms.Kind, floor bool, per int) {
	ctx := context.Background()
	l := algorithms.Limit{Algorithm: k, Requests: 1 << 40, Window: time.Second}
	nkeys := 10_000
	if k == algorithms.SlidingWindowLog {
		l = algorithms.Limit{Algorithm: k, Requests: 1000, Window: time.Second}
		nkeys = 16
	}
	rng := rand.New(rand.NewPCG(1, uint64(per)))
	command := func() *goredis.Cmd {
		sc := newScriptCall(per, per)
		for q := 0; q < per; q++ {
			key := fmt.Sprintf("bench:%d:%d", k, rng.IntN(nkeys))
			items := []backend.Item{{Key: key, Limit: l, Hits: 1}}
			sc.add(&group{items: []item{encodeItem(items, 0, key)}}, -1, true)
		}
		fn, arg := functionName, any(sc.args.b)
		if floor {
			fn, arg = "envoyrls_bench_floor", "0123456789abcdef0"
		}
		args := []any{"fcall", fn, len(sc.keys)}
		for _, key := range sc.keys {
			args = append(args, key)
		}
		return goredis.NewCmd(ctx, append(args, arg)...)
	}
	calls := (b.N + per - 1) / per
	b.ReportAllocs()
	cmd0, cpu0 := scriptCost(b, rc)
	b.ResetTimer()
	for sent := 0; sent < calls; {
		pipe := rc.Pipeline()
		for i := 0; i < 8 && sent < calls; i++ {
			_ = pipe.Process(ctx, command())
			sent++
		}
		cmds, _ := pipe.Exec(ctx)
		for _, c := range cmds {
			if err := c.Err(); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.StopTimer()
	cmd1, cpu1 := scriptCost(b, rc)
	n := float64(calls * per)
	b.ReportMetric((cmd1-cmd0)/n, "redis-µs/decision")
	b.ReportMetric((cpu1-cpu0)/n, "redis-cpu-µs/decision")
}
