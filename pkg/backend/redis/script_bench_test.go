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

// scriptCost reads, in µs, the time spent in FCALL and in the commands
// that scripts ran (INFO commandstats counts those too; INFO and CONFIG
// are left out), and the redis-server's CPU.
func scriptCost(b *testing.B, rc *goredis.Client) (cmd, inner, cpu float64) {
	b.Helper()
	txt, err := rc.Info(context.Background(), "commandstats", "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(txt, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		switch {
		case !ok:
		case strings.HasPrefix(k, "cmdstat_"):
			var usec float64
			for _, kv := range strings.Split(v, ",") {
				if a, x, _ := strings.Cut(kv, "="); a == "usec" {
					usec, _ = strconv.ParseFloat(x, 64)
				}
			}
			switch name := strings.TrimPrefix(k, "cmdstat_"); {
			case name == "fcall":
				cmd += usec
			case name != "info" && !strings.HasPrefix(name, "config"):
				inner += usec
			}
		case k == "used_cpu_user" || k == "used_cpu_sys":
			f, _ := strconv.ParseFloat(v, 64)
			cpu += f * 1e6
		}
	}
	return cmd, inner, cpu
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
			fn, arg := functionName, any(nil)
			if floor {
				fn, arg = "envoyrls_bench_floor", "0123456789abcdef0"
			}
			b.Run(name+"/"+mode, func(b *testing.B) { benchScript(b, rc, k, fn, arg, per) })
		}
	}
}

// benchScript sends FCALLs of fn, each with the keys of per requests of
// kind k and, as ARGV, arg (nil: the script's binary argument for those
// requests), and reports their cost per decision.
func benchScript(b *testing.B, rc *goredis.Client, k algorithms.Kind, fn string, arg any, per int) {
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
		argv := arg
		if argv == nil {
			argv = sc.args.b
		}
		args := []any{"fcall", fn, len(sc.keys)}
		for _, key := range sc.keys {
			args = append(args, key)
		}
		return goredis.NewCmd(ctx, append(args, argv)...)
	}
	calls := (b.N + per - 1) / per
	b.ReportAllocs()
	cmd0, inner0, cpu0 := scriptCost(b, rc)
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
	cmd1, inner1, cpu1 := scriptCost(b, rc)
	n := float64(calls * per)
	b.ReportMetric((cmd1-cmd0)/n, "redis-µs/decision")
	b.ReportMetric((inner1-inner0)/n, "commands-µs/decision")
	b.ReportMetric((cpu1-cpu0)/n, "redis-cpu-µs/decision")
}

// partsLibrary holds functions that each do one part of what the script
// does, to take a call's cost apart: return at once, return a reply of
// the script's size (five integers per request), run the script's Redis
// commands for a batch of fixed windows (TIME, one MGET, SET ... KEEPTTL of
// every key), and read the binary ARGV's items with struct.unpack.
const partsLibrary = `#!lua name=envoyrls_bench_parts
redis.register_function('envoyrls_parts_empty', function(keys, args) return {} end)
redis.register_function('envoyrls_parts_reply', function(keys, args)
	local out = {}
	for i = 1, 5 * #keys do out[i] = i end
	return out
end)
redis.register_function('envoyrls_parts_commands', function(keys, args)
	redis.call('TIME')
	redis.call('MGET', unpack(keys))
	for i = 1, #keys do
		redis.call('SET', keys[i], 'abcdefghijklmnopq', 'KEEPTTL')
	end
	return {}
end)
redis.register_function('envoyrls_parts_unpack', function(keys, args)
	local p = 1
	for i = 1, #keys do
		local _
		_, _, p = struct.unpack('<di4', args[1], p)
		_, _, _, _, _, _, _, _, _, p = struct.unpack('<I4BBBI4dddd', args[1], p)
	end
	return {}
end)
`

// BenchmarkRedisScriptParts measures, sent as BenchmarkRedisScript sends
// the script (fixed-window requests, one key each, on 10,000 keys), what
// the parts of a call cost Redis: an FCALL that returns at once, one that
// returns a reply of the script's size, the script's Redis commands alone,
// and reading its ARGV. Subtracted from BenchmarkRedisScript/fixed_window,
// they leave what the script's own Lua costs.
func BenchmarkRedisScriptParts(b *testing.B) {
	srv := redistest.StartStandalone(b)
	rc := srv.Client()
	if err := rc.FunctionLoad(context.Background(), partsLibrary).Err(); err != nil {
		b.Fatal(err)
	}
	for _, part := range []string{"empty", "reply", "commands", "unpack"} {
		for _, per := range []int{1, 32} {
			mode := "single"
			if per > 1 {
				mode = fmt.Sprintf("batched%d", per)
			}
			b.Run(part+"/"+mode, func(b *testing.B) {
				benchScript(b, rc, algorithms.FixedWindow, "envoyrls_parts_"+part, nil, per)
			})
		}
	}
}
