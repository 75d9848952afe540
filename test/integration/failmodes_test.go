package integration

import (
	"context"
	"flag"
	"fmt"
	"github.com/envoyrls/envoy-rls/internal/testutil"
	"sync/atomic"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// fmPrint prints the table of TestFailureModes on stdout (make failmodes).
var fmPrint = flag.Bool("failmodes.table", false, "print TestFailureModes' table of allowed calls per failure mode (make failmodes)")

// TestFailureModes runs, for each failure mode (local, allow, deny), three
// instances on one redis-server under load while Redis is overloaded (120
// clients with 20 ms deadlines), slow (frozen with SIGSTOP in short bursts),
// frozen (SIGSTOP until the fallback has decided enough calls to exhaust
// every instance's share, then SIGCONT) and killed (SIGKILL, then started
// again on the same port without its data), and checks the README's
// bounds: local allows at most the limit plus one limit per instance, deny
// at most the limit; Redis's final count includes every OK (write-backs
// are usage accounting) and the refused calls it ran late, and at most the
// hits counted as maybe twice more; deny charges refused calls only late,
// within the pipelines in flight. A killed Redis forgets its count: the
// bounds then start again at the restart. make failmodes prints the table.
func TestFailureModes(t *testing.T) {
	var cells []fmCell
	for _, mode := range []string{"local", "allow", "deny"} {
		t.Run(mode, func(t *testing.T) {
			e := startFailMode(t, mode)
			for _, sc := range []struct {
				name string
				run  func(*fmEnv, string) fmCell
			}{
				{"overload", fmOverload}, {"slow", fmSlow}, {"frozen", fmFrozen}, {"killed", fmKilled},
			} {
				trips := func() (n float64) {
					for _, p := range e.procs {
						n += metricCount(t, p, "envoy_rls_redis_node_down_total")
					}
					return n
				}
				before := trips()
				c := sc.run(e, "v-"+sc.name)
				t.Logf("%s: Redis found down %v times", sc.name, trips()-before)
				c.mode, c.scenario = mode, sc.name
				t.Logf("%s (outage %v, degraded %v, written back %v, over limit %v)", c.row(), c.outage.Round(time.Millisecond), c.d.degraded, c.d.written, c.d.overLimit)
				c.check(t)
				cells = append(cells, c)
			}
		})
	}
	if *fmPrint {
		fmt.Print(fmTable(cells) + "\n")
	} else {
		t.Logf("\n%s", fmTable(cells))
	}
}

// fmOverload: healthy Redis, 120 clients with Envoy's default 20 ms
// deadlines, until four times the limit was asked for.
func fmOverload(e *fmEnv, value string) fmCell {
	base := e.stats()
	ld := e.load(value, 120, 20*time.Millisecond)
	testutil.WaitEvery(e.t, procPoll, 60*time.Second, "four times the limit asked for", func() bool {
		return ld.count(time.Time{}, func(sample) bool { return true }) >= 4*fmL
	})
	ld.stop()
	return e.finish(ld, value, base, time.Time{}, 0, 0)
}

// fmSlow: Redis frozen in five short bursts under load, each until 20
// calls sent after the freeze have been answered, then running until every
// instance has a call decided by Redis again.
func fmSlow(e *fmEnv, value string) fmCell {
	base := e.stats()
	ld := e.load(value, 24, 50*time.Millisecond)
	var outage time.Duration
	for i := 0; i < 5; i++ {
		e.srv.Pause()
		start := time.Now()
		e.waitAnswered(ld, start, 20)
		e.srv.Resume()
		outage += time.Since(start)
		e.waitRedis()
	}
	ld.stop()
	return e.finish(ld, value, base, time.Time{}, outage, 0)
}

// fmFrozen: half the limit used in Redis, then Redis frozen as a load
// starts, until twice the calls that the limit plus every instance's share
// admit have been answered; then it resumes.
func fmFrozen(e *fmEnv, value string) fmCell {
	base := e.stats()
	pre := e.precharge(value, fmL/2)
	ld := e.load(value, 24, 50*time.Millisecond)
	e.srv.Pause()
	start := time.Now()
	e.waitAnswered(ld, start, 2*(fmN+1)*fmL)
	e.srv.Resume()
	outage := time.Since(start)
	e.waitRedis()
	ld.stop()
	return e.finish(ld, value, base, time.Time{}, outage, pre)
}

// fmKilled: half the limit used, then Redis killed (SIGKILL) as a load
// starts, until as many calls as in fmFrozen have been answered; then it
// is started again on the same port, empty.
func fmKilled(e *fmEnv, value string) fmCell {
	base := e.stats()
	pre := e.precharge(value, fmL/2)
	ld := e.load(value, 24, 50*time.Millisecond)
	kill := time.Now()
	e.srv.Stop()
	dead := time.Now()
	e.waitAnswered(ld, dead, 2*(fmN+1)*fmL)
	e.srv.Restart()
	outage := time.Since(kill)
	e.waitRedis()
	ld.stop()
	c := e.finish(ld, value, base, kill, outage, pre)
	// Calls sent once Redis was dead were never counted by the old one.
	c.okStarted = 0
	for _, s := range ld.all() {
		if s.err == nil && s.code == rlsv3.RateLimitResponse_OK && !s.at.Before(dead) {
			c.okStarted++
		}
	}
	return c
}

// waitAnswered waits until n calls sent at or after from have ended.
func (e *fmEnv) waitAnswered(ld *load, from time.Time, n int) {
	e.t.Helper()
	testutil.WaitEvery(e.t, procPoll, 60*time.Second, fmt.Sprintf("%d calls answered", n), func() bool {
		return ld.count(from, func(sample) bool { return true }) >= n
	})
}

// finish settles the instances and fills the cell: the load's answers
// (plus pre calls allowed before it), the counters' change since base and
// Redis's count.
func (e *fmEnv) finish(ld *load, value string, base fmStats, kill time.Time, outage time.Duration, pre int) fmCell {
	e.t.Helper()
	end := e.settle()
	c := fmCell{d: end.minus(base), outage: outage}
	c.count(ld, kill)
	c.calls += pre
	c.ok += pre
	c.raw = e.raw(value)
	return c
}

// precharge sends n calls one after the other with 2 s deadlines while
// Redis is healthy, and returns how many were allowed.
func (e *fmEnv) precharge(value string, n int) int {
	e.t.Helper()
	ok := 0
	for i := 0; i < n; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		r, err := e.procs[i%len(e.procs)].client().ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{
			Domain: "fm", Descriptors: []*commonv3.RateLimitDescriptor{descriptor("k", value)},
		})
		cancel()
		if err != nil {
			e.t.Fatalf("precharge: %v", err)
		}
		if r.OverallCode == rlsv3.RateLimitResponse_OK {
			ok++
		}
	}
	return ok
}

var probeSeq atomic.Int64

// waitRedis waits until every instance decides a call by Redis again: it
// probes each with a call on a fresh value (which no deny cache knows)
// until Redis's decision count of that instance grows.
func (e *fmEnv) waitRedis() {
	e.t.Helper()
	for i, p := range e.procs {
		testutil.WaitEvery(e.t, procPoll, 60*time.Second, fmt.Sprintf("instance %d deciding by Redis again", i), func() bool {
			before := metricCount(e.t, p, "envoy_rls_redis_decisions_total", "path=redis")
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_, err := p.client().ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{
				Domain: "fm", Descriptors: []*commonv3.RateLimitDescriptor{descriptor("k", fmt.Sprintf("probe-%d", probeSeq.Add(1)))},
			})
			return err == nil && metricCount(e.t, p, "envoy_rls_redis_decisions_total", "path=redis") > before
		})
	}
}
