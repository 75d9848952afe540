package integration

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"github.com/envoyrls/envoy-rls/internal/redistest"
	"github.com/envoyrls/envoy-rls/internal/rlqstest"
	"github.com/envoyrls/envoy-rls/internal/testutil"
)

// rlqsLoad drives an Envoy-like RLQS client at rate requests a second.
type rlqsLoad struct {
	c        *rlqstest.Client
	rate     atomic.Int64
	admitted atomic.Int64
}

func (l *rlqsLoad) run(id map[string]string, stop <-chan struct{}, wg *sync.WaitGroup) {
	defer wg.Done()
	last, due := time.Now(), 0.0
	for {
		select {
		case <-stop:
			return
		case <-time.After(5 * time.Millisecond):
		}
		now := time.Now()
		due += float64(l.rate.Load()) * now.Sub(last).Seconds()
		last = now
		for ; due >= 1; due-- {
			if l.c.Request(id) {
				l.admitted.Add(1)
			}
		}
	}
}

// envoyConn is a connection from its own loopback address (one host per
// Envoy) to any of addrs, as an Envoy cluster of the instances: when the
// one it uses goes away it moves to another.
func envoyConn(t *testing.T, host byte, addrs []string) *grpc.ClientConn {
	t.Helper()
	r := manual.NewBuilderWithScheme(fmt.Sprintf("rlqs%d", host))
	var as []resolver.Address
	for _, a := range addrs {
		as = append(as, resolver.Address{Addr: a})
	}
	r.InitialState(resolver.State{Addresses: as})
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, host)}}
	cc, err := grpc.NewClient(r.Scheme()+":///rlqs", grpc.WithResolvers(r), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) { return d.DialContext(ctx, "tcp", a) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// TestRLQSSeveralProcessesOneRedis: three envoy-rls processes (serve
// --rlqs on one Redis) divide one limit of 300 a second among six Envoy-like
// clients with skewed demands, while RLS requests on the same descriptor
// spend the same ledger: together they stay within the limit plus the
// bursts. SIGTERM ends one process promptly, its Envoys keep their
// assignments (nothing abandoned), reconnect to the others and take their
// shares over, and the total still holds.
func TestRLQSSeveralProcessesOneRedis(t *testing.T) {
	srv := redistest.StartStandalone(t)
	cfg := filepath.Join(t.TempDir(), "q.yaml")
	if err := os.WriteFile(cfg, []byte("domain: q\ndescriptors:\n  - key: user\n    rate_limit: {algorithm: token_bucket, unit: second, requests_per_unit: 300}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var procs []*proc
	var addrs []string
	for range 3 {
		p := startServe(t, nil, "--config", cfg, "--backend", "redis", "--redis-url", srv.URL(), "--rlqs", "--watch-config=false", "--shutdown-grace", "10s")
		procs = append(procs, p)
		addrs = append(addrs, p.grpcAddr)
	}
	id := map[string]string{"user": "shared"}
	demands := []int64{20, 40, 80, 160, 320, 640}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	loads := make([]*rlqsLoad, len(demands))
	for i, d := range demands {
		// Each client prefers its own instance first, then the others.
		order := append(append([]string(nil), addrs[i%3:]...), addrs[:i%3]...)
		c := rlqstest.New(rlqstest.Options{Conn: envoyConn(t, byte(30+i), order), Domain: "q", Period: 200 * time.Millisecond})
		t.Cleanup(c.Close)
		loads[i] = &rlqsLoad{c: c}
		loads[i].rate.Store(d)
		wg.Add(1)
		go loads[i].run(id, stop, &wg)
	}
	defer func() { close(stop); wg.Wait() }()

	// RLS on the same descriptor, through the third process.
	var rlsOK atomic.Int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		req := &rlsv3.RateLimitRequest{Domain: "q", Descriptors: []*commonv3.RateLimitDescriptor{{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "user", Value: "shared"}}}}}
		for {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			resp, err := procs[2].client().ShouldRateLimit(ctx, req)
			cancel()
			if err == nil && resp.GetOverallCode() == rlsv3.RateLimitResponse_OK {
				rlsOK.Add(1)
			}
		}
	}()

	total := func() int64 {
		n := rlsOK.Load()
		for _, l := range loads {
			n += l.admitted.Load()
		}
		return n
	}
	// The bursts every Envoy's token bucket may hold, and RLS's: the
	// limit's capacity (300) each side, plus one token per Envoy rounding.
	burst := 2*300.0 + float64(len(loads))
	measure := func(what string, d time.Duration) {
		n0, r0, t0 := total(), rlsOK.Load(), time.Now()
		time.Sleep(d)
		n, el := total()-n0, time.Since(t0).Seconds()
		rls := rlsOK.Load() - r0
		if bound := 300*el*1.03 + burst; float64(n) > bound {
			t.Fatalf("%s: admitted %d in %.2fs, above %.0f", what, n, el, bound)
		}
		t.Logf("%s: %.1f/s admitted of 300 (RLS %.1f/s)", what, float64(n)/el, float64(rls)/el)
	}
	testutil.WaitEvery(t, procPoll, 20*time.Second, "every client assigned", func() bool {
		for _, l := range loads {
			if !l.c.Bucket(id).Assigned {
				return false
			}
		}
		return true
	})
	measure("three processes, starting", 2*time.Second)
	measure("three processes", 3*time.Second)

	// SIGTERM one process: it exits well within its 10 s grace although
	// its RLQS streams would last forever.
	start := time.Now()
	if code := procs[0].stop(t); code != 0 {
		t.Fatalf("exit code %d after SIGTERM", code)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("SIGTERM took %v with RLQS streams open", took)
	}
	for i, l := range loads {
		for _, a := range l.c.Actions(id) {
			if a.GetAbandonAction() != nil {
				t.Fatalf("client %d was sent an abandon", i)
			}
		}
	}
	testutil.WaitEvery(t, procPoll, 20*time.Second, "the Envoys of the stopped process to reconnect", func() bool {
		for _, l := range loads {
			if !l.c.Connected() || !l.c.Bucket(id).Assigned {
				return false
			}
		}
		return true
	})
	measure("two processes", 3*time.Second)
}
