package integration

import (
	"context"
	"flag"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/envoyrls/envoy-rls/internal/redistest"
	"github.com/envoyrls/envoy-rls/internal/schedprobe"
	"github.com/envoyrls/envoy-rls/internal/testutil"
)

// stallOutage is how long TestRedisStall freezes Redis and keeps it killed
// (10s for docs/failure-policy.md's figures, on a build without -race).
var stallOutage = flag.Duration("stall.outage", time.Second, "how long TestRedisStall freezes, and kills, Redis")

const stallYAML = `
domain: st
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 1000000000}
`

// stallPhase is a span of a load's calls: their share that failed at the
// client, and their latencies' median.
type stallPhase struct {
	calls, failed int
	p50           time.Duration
}

func (p stallPhase) share() float64 { return float64(p.failed) / float64(max(p.calls, 1)) }

func (p stallPhase) String() string {
	return fmt.Sprintf("%d calls, %.2f %% failed, p50 %v", p.calls, 100*p.share(), p.p50)
}

// phase sums the calls of ld sent in [from, to) that match keep.
func phase(ld *load, from, to time.Time, keep func(sample) bool) stallPhase {
	var p stallPhase
	var lat []time.Duration
	for _, s := range ld.all() {
		if s.at.Before(from) || !s.at.Before(to) || !keep(s) {
			continue
		}
		p.calls++
		if s.err != nil {
			p.failed++
		}
		lat = append(lat, s.latency)
	}
	if len(lat) > 0 {
		slices.Sort(lat)
		p.p50 = lat[len(lat)/2]
	}
	return p
}

// TestRedisStall: one instance (failure mode local), 60 clients with
// Envoy's 20 ms deadlines, each sending a call every 20 ms at most. Standalone: Redis frozen (SIGSTOP) for
// -stall.outage, then killed for as long and started again. The share of
// calls that fail at the client across the freeze and the kill is at most
// one point above the healthy phases' of the same run: the store notices
// the outage once, within tens of milliseconds, and the failure mode
// answers at once from then on. Cluster (failure mode deny, so that the
// calls of the dead master's slots show as UNAVAILABLE; without
// cluster-require-full-coverage, so that Redis serves the other slots
// once it marks the master failed): one master killed;
// the calls on the others' slots keep a median latency within twice the
// healthy one (plus the measured scheduling slack).
func TestRedisStall(t *testing.T) {
	if testing.Short() {
		t.Skip("process-heavy")
	}
	cfg := filepath.Join(t.TempDir(), "st.yaml")
	writeFile(t, cfg, stallYAML)
	const clients, deadline = 60, 20 * time.Millisecond
	// Each client sends a call every 20 ms at most (3,000 calls/s in
	// all), so that the load is the same before and during an outage:
	// calls answered at once by the failure mode would otherwise make
	// their clients call the faster, and the others wait for a CPU.
	const every = 20 * time.Millisecond
	paced := func(p *proc) *load {
		l := &load{done: make(chan struct{})}
		for c := 0; c < clients; c++ {
			l.wg.Add(1)
			go func() {
				defer l.wg.Done()
				cl := p.client()
				req := &rlsv3.RateLimitRequest{Domain: "st", Descriptors: []*commonv3.RateLimitDescriptor{descriptor("k", fmt.Sprint("v", c))}}
				tick := time.NewTicker(every)
				defer tick.Stop()
				for {
					select {
					case <-l.done:
						return
					case <-tick.C:
					}
					ctx, cancel := context.WithTimeout(context.Background(), deadline)
					t0 := time.Now()
					r, err := cl.ShouldRateLimit(ctx, req)
					cancel()
					s := sample{client: c, err: err, latency: time.Since(t0), at: t0}
					if r != nil {
						s.code = r.OverallCode
					}
					l.mu.Lock()
					l.samples = append(l.samples, s)
					l.mu.Unlock()
				}
			}()
		}
		return l
	}
	all := func(sample) bool { return true }

	t.Run("standalone", func(t *testing.T) {
		srv := redistest.StartStandalone(t)
		p := startServe(t, nil, "--config", cfg, "--backend", "redis", "--redis-url", srv.URL())
		ld := paced(p)
		healthy := func() (time.Time, time.Time) {
			from := time.Now()
			testutil.WaitFor(t, 30*time.Second, "a healthy phase", func() bool {
				return time.Since(from) >= *stallOutage/2 && ld.count(from, all) >= 500
			})
			return from, time.Now()
		}
		h1a, h1b := healthy()
		probe := schedprobe.Start()
		defer probe.Stop()
		srv.Pause()
		frozen := time.Now()
		time.Sleep(*stallOutage) // the outage's length is the scenario itself
		srv.Resume()
		resumed := time.Now()
		h2a, h2b := healthy()
		srv.Stop()
		killed := time.Now()
		time.Sleep(*stallOutage)
		srv.Restart()
		restarted := time.Now()
		testutil.WaitFor(t, 30*time.Second, "deciding by Redis again", func() bool {
			return metricCount(t, p, "envoy_rls_redis_nodes_down") == 0 && metricCount(t, p, "envoy_rls_redis_node_up_total") >= 2
		})
		h3a, h3b := healthy()
		ld.stop()

		base := phase(ld, h1a, h1b, all)
		for _, h := range [][2]time.Time{{h2a, h2b}, {h3a, h3b}} {
			q := phase(ld, h[0], h[1], all)
			base.calls, base.failed = base.calls+q.calls, base.failed+q.failed
		}
		fr := phase(ld, frozen, resumed, all)
		kl := phase(ld, killed, restarted, all)
		out := stallPhase{calls: fr.calls + kl.calls, failed: fr.failed + kl.failed}
		t.Logf("outage %v: healthy %v; frozen %v; killed %v; trips %v, returns %v",
			*stallOutage, base, fr, kl, metricCount(t, p, "envoy_rls_redis_node_down_total"), metricCount(t, p, "envoy_rls_redis_node_up_total"))
		// The target: across a 10 s freeze and a 10 s kill, at most one
		// point more failed calls than while healthy, that is 200 ms of
		// the outages' calls. As time, it holds for any outage length:
		// the calls that failed above the baseline, at the outages' call
		// rate, come to at most 200 ms (plus the measured scheduling
		// slack).
		span := resumed.Sub(frozen) + restarted.Sub(killed)
		excess := float64(out.failed) - base.share()*float64(out.calls)
		lost := time.Duration(excess / float64(out.calls) * float64(span))
		slack := probe.Stop()
		t.Logf("failed calls above the baseline: %.0f, %v of the outages' %v (%.2f points over 10 s + 10 s)", excess, lost.Round(time.Millisecond), span.Round(time.Millisecond), 100*float64(lost)/float64(20*time.Second))
		if lost > 200*time.Millisecond+slack {
			t.Errorf("%.2f %% of the calls failed across the freeze and the kill, %.2f %% while healthy: %v of the outages lost, more than 200 ms (+ measured scheduling slack %v)", 100*out.share(), 100*base.share(), lost, slack)
		}
		if n := metricCount(t, p, "envoy_rls_redis_node_down_total"); n < 2 {
			t.Errorf("Redis was found down %v times, want at least 2 (the freeze, the kill)", n)
		}
	})

	t.Run("cluster", func(t *testing.T) {
		cl := redistest.StartCluster(t, 3)
		// Once the cluster marks the dead master failed (after
		// cluster-node-timeout), a cluster that requires full coverage
		// refuses every call (CLUSTERDOWN): the other masters' slots
		// keep working only without that requirement.
		for _, n := range cl.Nodes {
			if err := n.Client().ConfigSet(context.Background(), "cluster-require-full-coverage", "no").Err(); err != nil {
				t.Fatal(err)
			}
		}
		p := startServe(t, nil, "--config", cfg, "--backend", "redis", "--redis-cluster", cl.Addrs()[0], "--failure-mode", "deny")
		ld := paced(p)
		from := time.Now()
		testutil.WaitFor(t, 30*time.Second, "a healthy phase", func() bool {
			return time.Since(from) >= *stallOutage/2 && ld.count(from, all) >= 500
		})
		before := phase(ld, from, time.Now(), all)
		probe := schedprobe.Start()
		defer probe.Stop()
		cl.Nodes[1].Stop()
		killed := time.Now()
		testutil.WaitFor(t, 30*time.Second, "the master found down", func() bool {
			return metricCount(t, p, "envoy_rls_redis_nodes_down") == 1
		})
		down := time.Now()
		testutil.WaitFor(t, 30*time.Second, "a phase with a master down", func() bool {
			return time.Since(down) >= *stallOutage/2 && ld.count(down, all) >= 500
		})
		end := time.Now()
		ld.stop()
		// The clients of the dead master's slots: every call of theirs
		// since it was found down is UNAVAILABLE.
		unavailable, calls := map[int]int{}, map[int]int{}
		for _, s := range ld.all() {
			if !s.at.Before(down) {
				calls[s.client]++
				if status.Code(s.err) == codes.Unavailable {
					unavailable[s.client]++
				}
			}
		}
		dead := map[int]bool{}
		for c, n := range unavailable {
			// A healthy slot's call may miss its deadline too (UNAVAILABLE
			// under deny): most of a dead slot's calls are refused.
			if 2*n > calls[c] {
				dead[c] = true
			}
		}
		healthySlots := func(s sample) bool { return !dead[s.client] }
		during := phase(ld, down, end, healthySlots)
		beforeHealthy := phase(ld, from, killed, healthySlots)
		t.Logf("healthy %v (its healthy slots: %v); a master down (noticed after %v): healthy slots %v, %d of %d clients on the dead master",
			before, beforeHealthy, down.Sub(killed).Round(time.Millisecond), during, len(dead), clients)
		if len(dead) == 0 || len(dead) == clients {
			t.Fatalf("%d of %d clients on the dead master: the test tested nothing", len(dead), clients)
		}
		if slack := probe.Stop(); during.p50 > 2*beforeHealthy.p50+slack {
			t.Errorf("healthy slots' p50 %v with a master down, %v before (measured scheduling slack %v)", during.p50, beforeHealthy.p50, slack)
		}
	})
}
