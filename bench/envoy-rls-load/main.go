// Command envoy-rls-load drives a RateLimitService over gRPC and reports
// throughput and latency. It is bounded: it stops after --requests calls or
// --duration, whichever comes first, and only targets the address it is given
// (use loopback).
//
//	envoy-rls-load --addr 127.0.0.1:8081 --domain example --key remote_address \
//	    --keys 10000 --concurrency 64 --duration 10s
//
// The keys are asked in turn, or with --zipf s (s > 1) drawn from a Zipf
// distribution of exponent s over the --keys values: value i with
// probability proportional to 1/(i+1)^s, a few hot keys and a long tail.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

type config struct {
	addr        string
	domain      string
	key         string
	keys        int
	zipf        float64
	concurrency int
	conns       int
	duration    time.Duration
	requests    int64
	timeout     time.Duration
}

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "envoy-rls-load:", err)
		os.Exit(1)
	}
}

func run(args []string, out io.Writer) error {
	var c config
	fs := flag.NewFlagSet("envoy-rls-load", flag.ContinueOnError)
	fs.StringVar(&c.addr, "addr", "127.0.0.1:8081", "gRPC address of the rate limit service")
	fs.StringVar(&c.domain, "domain", "example", "request domain")
	fs.StringVar(&c.key, "key", "remote_address", "descriptor entry key")
	fs.IntVar(&c.keys, "keys", 1, "distinct descriptor values (1 = one hot key)")
	fs.Float64Var(&c.zipf, "zipf", 0, "draw the values from a Zipf distribution of this exponent (> 1; 0: every value in turn)")
	fs.IntVar(&c.concurrency, "concurrency", 64, "concurrent callers")
	fs.IntVar(&c.conns, "conns", 4, "gRPC connections shared by the callers")
	fs.DurationVar(&c.duration, "duration", 10*time.Second, "stop after this long")
	fs.Int64Var(&c.requests, "requests", 5_000_000, "stop after this many calls")
	fs.DurationVar(&c.timeout, "timeout", time.Second, "deadline of each call")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if c.keys < 1 || c.concurrency < 1 || c.conns < 1 || c.requests < 1 || c.duration <= 0 {
		return errors.New("--keys, --concurrency, --conns, --requests and --duration must be positive")
	}
	if c.zipf != 0 && !(c.zipf > 1) {
		return errors.New("--zipf must be more than 1 (or 0: every value in turn)")
	}
	r, err := load(c)
	if err != nil {
		return err
	}
	r.print(out, c)
	return nil
}

type result struct {
	elapsed      time.Duration
	ok, over     int64
	errs         int64
	firstErr     error
	latencies    []time.Duration
	latencyLimit int
}

func load(c config) (*result, error) {
	conns := make([]*grpc.ClientConn, c.conns)
	for i := range conns {
		cc, err := grpc.NewClient(c.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return nil, err
		}
		defer cc.Close()
		conns[i] = cc
	}
	values := make([]string, c.keys)
	for i := range values {
		values[i] = "v" + strconv.Itoa(i)
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.duration)
	defer cancel()

	var issued atomic.Int64
	var mu sync.Mutex
	res := &result{latencyLimit: 1_000_000}
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < c.concurrency; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			client := rlsv3.NewRateLimitServiceClient(conns[w%len(conns)])
			var ok, over, errs int64
			var firstErr error
			lat := make([]time.Duration, 0, 4096)
			var zipf *rand.Zipf
			if c.zipf > 1 && c.keys > 1 {
				zipf = rand.NewZipf(rand.New(rand.NewPCG(uint64(w), 1)), c.zipf, 1, uint64(c.keys-1))
			}
			for i := w; ctx.Err() == nil && issued.Add(1) <= c.requests; i += c.concurrency {
				v := values[i%len(values)]
				if zipf != nil {
					v = values[zipf.Uint64()]
				}
				req := &rlsv3.RateLimitRequest{
					Domain: c.domain,
					Descriptors: []*commonv3.RateLimitDescriptor{{
						Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: c.key, Value: v}},
					}},
				}
				// Calls run to completion: the run's end only stops new ones.
				cctx, ccancel := context.WithTimeout(context.Background(), c.timeout)
				t0 := time.Now()
				resp, err := client.ShouldRateLimit(cctx, req)
				d := time.Since(t0)
				ccancel()
				switch {
				case err != nil:
					errs++
					if firstErr == nil {
						firstErr = err
					}
				case resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT:
					over++
				default:
					ok++
				}
				lat = append(lat, d)
			}
			mu.Lock()
			res.ok += ok
			res.over += over
			res.errs += errs
			if res.firstErr == nil {
				res.firstErr = firstErr
			}
			if len(res.latencies) < res.latencyLimit {
				res.latencies = append(res.latencies, lat...)
			}
			mu.Unlock()
		}(w)
	}
	wg.Wait()
	res.elapsed = time.Since(start)
	return res, nil
}

func (r *result) print(out io.Writer, c config) {
	total := r.ok + r.over + r.errs
	slices.Sort(r.latencies)
	q := func(p float64) time.Duration {
		if len(r.latencies) == 0 {
			return 0
		}
		return r.latencies[min(len(r.latencies)-1, int(p*float64(len(r.latencies))))]
	}
	fmt.Fprintf(out, "target %s domain %s key %s keys %d zipf %g concurrency %d conns %d\n", c.addr, c.domain, c.key, c.keys, c.zipf, c.concurrency, c.conns)
	fmt.Fprintf(out, "calls %d in %v: %.0f calls/s (ok %d, over_limit %d, errors %d)\n",
		total, r.elapsed.Round(time.Millisecond), float64(total)/r.elapsed.Seconds(), r.ok, r.over, r.errs)
	fmt.Fprintf(out, "latency p50 %v p90 %v p99 %v max %v\n", q(0.50), q(0.90), q(0.99), q(1))
	if r.firstErr != nil {
		fmt.Fprintf(out, "first error: %v\n", r.firstErr)
	}
}
