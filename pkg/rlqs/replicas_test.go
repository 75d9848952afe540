package rlqs

import (
	"fmt"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/envoyrls/envoy-rls/internal/redistest"
	"github.com/envoyrls/envoy-rls/internal/rlqstest"
	"github.com/envoyrls/envoy-rls/internal/testutil"
	"github.com/envoyrls/envoy-rls/pkg/backend/redis"
	"github.com/envoyrls/envoy-rls/pkg/descriptors"
)

// instances starts n RLQS services on real time sharing one Redis (shares
// and ledger), each on its own loopback port.
func instances(t *testing.T, n int, doc string) []string {
	t.Helper()
	srv := redistest.StartStandalone(t)
	cfg, err := descriptors.ParseDocumentsWith([]descriptors.Document{{File: "q.yaml", Data: []byte(doc)}}, descriptors.Options{OrderFree: true})
	if err != nil {
		t.Fatal(err)
	}
	var addrs []string
	for range n {
		store, err := redis.New(redis.Options{URL: srv.URL()})
		if err != nil {
			t.Fatal(err)
		}
		c := srv.Client()
		w := &testWriter{t: t}
		t.Cleanup(func() { w.mu.Lock(); w.done = true; w.mu.Unlock() })
		svc := New(Options{Config: func() *descriptors.Config { return cfg }, Ledger: store, Shares: NewRedisShares(c, "r:"), Logger: slogTo(w)})
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		g := grpc.NewServer()
		svc.Register(g)
		go func() { _ = g.Serve(lis) }()
		t.Cleanup(func() {
			svc.Shutdown()
			g.Stop()
			svc.Close()
			store.Close()
			c.Close()
		})
		addrs = append(addrs, lis.Addr().String())
	}
	return addrs
}

// load drives a client at rate requests a second on bucket id until stop,
// counting what it admits once counting is set.
type load struct {
	c        *rlqstest.Client
	rate     atomic.Int64 // requests per second
	burst    bool         // on for 300 ms, off for 300 ms, at twice rate
	admitted atomic.Int64
	offered  atomic.Int64
}

func (l *load) run(id map[string]string, stop <-chan struct{}, wg *sync.WaitGroup) {
	defer wg.Done()
	start, issued := time.Now(), 0.0
	last := start
	for {
		select {
		case <-stop:
			return
		case <-time.After(5 * time.Millisecond):
		}
		now := time.Now()
		rate := float64(l.rate.Load())
		if l.burst {
			rate *= 2
			if now.Sub(start)%(600*time.Millisecond) >= 300*time.Millisecond {
				rate = 0
			}
		}
		issued += rate * now.Sub(last).Seconds()
		last = now
		for issued >= 1 {
			issued--
			l.offered.Add(1)
			if l.c.Request(id) {
				l.admitted.Add(1)
			}
		}
	}
}

// TestSeveralInstancesShareOneLimit: six Envoy-like clients with skewed
// demands (25 to 800 requests a second) on three instances sharing one
// Redis: together they admit no more than the limit of 500 a second (plus
// the bursts their token buckets hold), their shares come within a
// tolerance of max-min fair, and when the biggest one goes away its share
// goes to the others once its TTL is over.
func TestSeveralInstancesShareOneLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("real time")
	}
	addrs := instances(t, 3, `
domain: q
descriptors:
  - key: user
    rate_limit: {algorithm: token_bucket, unit: second, requests_per_unit: 500}
`)
	const period = 200 * time.Millisecond
	id := bucketID("user", "u")
	demands := []int64{25, 50, 100, 200, 400, 800}
	loads := make([]*load, len(demands))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i, d := range demands {
		cc := dial(t, addrs[i%len(addrs)], &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(10+i))})
		c := rlqstest.New(rlqstest.Options{Conn: cc, Domain: "q", Period: period})
		t.Cleanup(c.Close)
		loads[i] = &load{c: c}
		loads[i].rate.Store(d)
		wg.Add(1)
		go loads[i].run(id, stop, &wg)
	}
	defer func() { close(stop); wg.Wait() }()

	// Settle, then measure the admitted requests over a few seconds.
	expected := []float64{37.5, 75, 96.875, 96.875, 96.875, 96.875} // max-min of 1.5x the demands
	testutil.WaitFor(t, 20*time.Second, "the shares to settle near max-min fair", func() bool {
		for i, l := range loads {
			if r := l.c.Bucket(id).Rate; math.Abs(r-expected[i]) > 0.25*expected[i] {
				return false
			}
		}
		return true
	})
	before := make([]int64, len(loads))
	offered := make([]int64, len(loads))
	for i, l := range loads {
		before[i] = l.admitted.Load()
		offered[i] = l.offered.Load()
	}
	t0 := time.Now()
	time.Sleep(3 * time.Second)
	el := time.Since(t0).Seconds()
	total := int64(0)
	var got []string
	for i, l := range loads {
		n := l.admitted.Load() - before[i]
		total += n
		got = append(got, fmt.Sprintf("%.1f of %.1f", float64(n)/el, float64(l.offered.Load()-offered[i])/el))
	}
	// Bursts: every token bucket may hold its max_tokens at the start;
	// they are shares of the limit's burst of 500 (rounded up, at least 1).
	if bound := 500*el*1.02 + 500 + float64(len(loads)); float64(total) > bound {
		t.Fatalf("admitted %d in %.2fs (%v per client per second), above %.0f", total, el, got, bound)
	}
	t.Logf("admitted per client per second: %v, total %.1f/s", got, float64(total)/el)

	// The biggest client goes away; once its TTL (1 s for 200 ms reports)
	// is over, the others take its share.
	gone := loads[5]
	gone.rate.Store(0)
	gone.c.Close()
	left := time.Now()
	testutil.WaitFor(t, 20*time.Second, "the others to share what the gone client held", func() bool {
		s := 0.0
		for _, l := range loads[:5] {
			s += l.c.Bucket(id).Rate
		}
		return s > 495
	})
	if took := time.Since(left); took < ttlFor(period) {
		t.Fatalf("the gone client's share was reused after %v, before its TTL of %v", took, ttlFor(period))
	}
}

// TestBurstyLoadsStayWithinTheLimit: Envoys whose load comes in bursts
// (twice their rate for 300 ms, then nothing for 300 ms) beside steady
// ones, on two instances: together within the limit and its burst.
func TestBurstyLoadsStayWithinTheLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("real time")
	}
	addrs := instances(t, 2, `
domain: q
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 300}
`)
	id := bucketID("user", "u")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var loads []*load
	for i, d := range []int64{200, 300, 300, 100} {
		cc := dial(t, addrs[i%len(addrs)], &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(20+i))})
		c := rlqstest.New(rlqstest.Options{Conn: cc, Domain: "q", Period: 200 * time.Millisecond})
		t.Cleanup(c.Close)
		l := &load{c: c, burst: i == 1 || i == 2}
		l.rate.Store(d)
		loads = append(loads, l)
		wg.Add(1)
		go l.run(id, stop, &wg)
	}
	defer func() { close(stop); wg.Wait() }()
	time.Sleep(2 * time.Second)
	count := func() (n int64) {
		for _, l := range loads {
			n += l.admitted.Load()
		}
		return n
	}
	n0, t0 := count(), time.Now()
	time.Sleep(4 * time.Second)
	n, el := count()-n0, time.Since(t0).Seconds()
	// A fixed window of 300/s: the shares are of 300/s with a burst of 300.
	if bound := 300*el*1.02 + 300 + float64(len(loads)); float64(n) > bound {
		t.Fatalf("admitted %d in %.2fs, above %.0f", n, el, bound)
	}
	t.Logf("admitted %.1f/s of 300", float64(n)/el)
}
