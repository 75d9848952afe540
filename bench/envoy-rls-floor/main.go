// Command envoy-rls-floor is the floor of `make bench`: a RateLimitService
// that answers OK to every call without looking at the request. Whatever
// it costs per call (gRPC framing, HTTP/2, the load generator on the same
// machine) any rate limit service pays too, so the bench states every
// figure of a real service beside this one.
//
//	envoy-rls-floor --addr 127.0.0.1:8091
//
// It serves gRPC calls on the same pool of stream workers as envoy-rls
// (--grpc-stream-workers, the same default): a worker keeps its grown
// stack where a goroutine per call grows a new one in every call, which
// costs a call a few µs of CPU. With a floor on grpc-go's defaults, that
// saving, which has nothing to do with deciding, would show as envoy-rls
// costing less than it does beside the floor.
//
// It is a benchmark tool, not a service: it decides nothing.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"syscall"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "envoy-rls-floor:", err)
		os.Exit(1)
	}
}

// DefaultStreamWorkers is envoy-rls's default --grpc-stream-workers;
// TestFloorRunsEnvoyRLSsStreamWorkers keeps the two equal.
const DefaultStreamWorkers = 64

// floor answers OK to every call.
type floor struct {
	rlsv3.UnimplementedRateLimitServiceServer
}

var okResponse = &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}

func (floor) ShouldRateLimit(context.Context, *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	return okResponse, nil
}

// run serves until ctx ends. It prints the address it listens on, which
// tells a caller that asked for port 0 where it is.
func run(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("envoy-rls-floor", flag.ContinueOnError)
	fs.SetOutput(out)
	addr := fs.String("addr", "127.0.0.1:8091", "gRPC listen address")
	debug := fs.String("debug-addr", "", "listener for /debug/pprof/, so that the floor's CPU profile can be set beside envoy-rls's under the same load (empty: none)")
	workers := fs.Uint("grpc-stream-workers", DefaultStreamWorkers, "goroutines that run gRPC calls, as envoy-rls's flag of that name (0: a goroutine per call, grpc-go's default)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	lis, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	if *workers > 1<<16 {
		return fmt.Errorf("--grpc-stream-workers %d: at most %d", *workers, 1<<16)
	}
	if *debug != "" {
		dl, err := net.Listen("tcp", *debug)
		if err != nil {
			lis.Close()
			return err
		}
		mux := http.NewServeMux()
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = hs.Serve(dl) }()
		defer hs.Close()
		fmt.Fprintln(out, "envoy-rls-floor: /debug/pprof/ on", dl.Addr())
	}
	srv := grpc.NewServer(grpc.NumStreamWorkers(uint32(*workers)))
	rlsv3.RegisterRateLimitServiceServer(srv, floor{})
	fmt.Fprintln(out, "envoy-rls-floor: listening on", lis.Addr())
	go func() {
		<-ctx.Done()
		srv.GracefulStop()
	}()
	return srv.Serve(lis)
}
