package main

// The Rate Limit Quota Service (--rlqs): flags, the gRPC server's options
// it needs, and its registration. See docs/rlqs.md.

import (
	"context"
	"errors"
	"fmt"

	goredis "github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/envoyrls/envoy-rls/pkg/backend"
	"github.com/envoyrls/envoy-rls/pkg/rlqs"
)

// rlqsOptions are the RLQS service's bounds and defaults (serve). The
// --rlqs flag itself is a load option: check-config takes it too.
type rlqsOptions struct {
	RLQSMaxStreams          int
	RLQSMaxBucketsPerStream int
	RLQSMaxBuckets          int
	RLQSMaxReportSize       byteSize
	RLQSUnmatched           rlqsDefault
	RLQSAbandonAfter        int
	RLQSHysteresis          int
}

func (o *rlqsOptions) addFlags(fs *flagSet) {
	fs.IntVar(&o.RLQSMaxStreams, "rlqs-max-streams", rlqs.DefaultMaxStreams, "--rlqs: most RLQS streams open at once (one per Envoy and domain); more are refused with RESOURCE_EXHAUSTED. Each holds a gRPC stream worker of its own, beside --grpc-stream-workers")
	fs.IntVar(&o.RLQSMaxBucketsPerStream, "rlqs-max-buckets-per-stream", rlqs.DefaultMaxBucketsPerStream, "--rlqs: most quota buckets of one stream; further buckets are abandoned")
	fs.IntVar(&o.RLQSMaxBuckets, "rlqs-max-buckets", rlqs.DefaultMaxBuckets, "--rlqs: most quota buckets of all streams together; further buckets are abandoned")
	o.RLQSMaxReportSize = rlqs.MinReportSize
	fs.TextVar(&o.RLQSMaxReportSize, "rlqs-max-report-size", &o.RLQSMaxReportSize, "--rlqs: largest RLQS usage report accepted, at least 4MiB (Envoy sends all of a stream's buckets in one report); the gRPC server reads messages up to the larger of this and --grpc-max-recv-msg-size, and refuses RLS requests over --grpc-max-recv-msg-size once read")
	fs.TextVar(&o.RLQSUnmatched, "rlqs-unmatched", rlqsDefault("allow_all"), "--rlqs: the assignment of a quota bucket that matches no descriptor (or names a domain the config does not have): allow_all or deny_all")
	fs.IntVar(&o.RLQSAbandonAfter, "rlqs-abandon-after", rlqs.DefaultAbandonAfter, "--rlqs: abandon a quota bucket after this many reports in a row without a request (Envoy forgets it until its next request; this is what bounds Envoy's bucket memory); 0 never abandons")
	fs.IntVar(&o.RLQSHysteresis, "rlqs-hysteresis", rlqs.DefaultHysteresis, "--rlqs: raise a share only once this many reports in a row asked for more (lowerings apply at once); 0 raises at the first")
}

// validate checks the bounds against each other and the listeners'; c
// names where a value came from.
func (o rlqsOptions) validate(c *command, l listenerOptions) []error {
	var errs []error
	for _, v := range []struct {
		name string
		v    int
		min  int
	}{
		{"rlqs-max-streams", o.RLQSMaxStreams, 1},
		{"rlqs-max-buckets-per-stream", o.RLQSMaxBucketsPerStream, 1},
		{"rlqs-max-buckets", o.RLQSMaxBuckets, 1},
		{"rlqs-abandon-after", o.RLQSAbandonAfter, 0},
		{"rlqs-hysteresis", o.RLQSHysteresis, 0},
	} {
		if v.v < v.min {
			errs = append(errs, fmt.Errorf("%s: must be at least %d", c.value(v.name, fmt.Sprint(v.v)), v.min))
		}
	}
	if o.RLQSMaxReportSize < rlqs.MinReportSize || o.RLQSMaxReportSize > maxGRPCMaxRecvMsgSize {
		errs = append(errs, fmt.Errorf("%s: want %s to %s", c.value("rlqs-max-report-size", formatSize(uint64(o.RLQSMaxReportSize))), formatSize(rlqs.MinReportSize), formatSize(maxGRPCMaxRecvMsgSize)))
	}
	if o.RLQSMaxStreams+l.GRPCStreamWorkers > maxGRPCStreamWorkers {
		errs = append(errs, fmt.Errorf("--rlqs-max-streams plus --grpc-stream-workers must be at most %d", maxGRPCStreamWorkers))
	}
	return errs
}

// rlqsDefault is --rlqs-unmatched: allow_all or deny_all.
type rlqsDefault string

func (d rlqsDefault) MarshalText() ([]byte, error) { return []byte(d), nil }

func (d *rlqsDefault) UnmarshalText(b []byte) error {
	switch v := rlqsDefault(b); v {
	case "allow_all", "deny_all":
		*d = v
		return nil
	}
	return errors.New("want allow_all or deny_all")
}

// serverOptions are the gRPC server options --rlqs needs beside
// grpcServerOptions': messages as large as a report; a stream worker per
// RLQS stream on top of the RLS calls' (a stream holds its worker for its
// life, and RLS calls must still find theirs); RLS requests held to
// --grpc-max-recv-msg-size once read.
func (o rlqsOptions) serverOptions(l listenerOptions) []grpc.ServerOption {
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(int(max(l.GRPCMaxRecvMsgSize, o.RLQSMaxReportSize))),
		grpc.ChainUnaryInterceptor(maxRequestSize(int(l.GRPCMaxRecvMsgSize))),
	}
	if l.GRPCStreamWorkers > 0 {
		opts = append(opts, grpc.NumStreamWorkers(uint32(l.GRPCStreamWorkers+o.RLQSMaxStreams)))
	}
	return opts
}

// maxRequestSize refuses unary requests larger than limit bytes with
// RESOURCE_EXHAUSTED, as the gRPC server's own limit would.
func maxRequestSize(limit int) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		var n int
		switch m := req.(type) {
		case interface{ SizeVT() int }:
			n = m.SizeVT()
		case proto.Message:
			n = proto.Size(m)
		}
		if n > limit {
			return nil, status.Errorf(codes.ResourceExhausted, "grpc: received message larger than max (%d vs. %d)", n, limit)
		}
		return handler(ctx, req)
	}
}

// startRLQS makes the RLQS service and registers it on the gRPC server,
// with its health status. Its shares live in Redis with the Redis backend
// (every instance on that Redis divides each limit), else in the process.
func (s *server) startRLQS() {
	if !s.o.Source.Load.RLQS {
		return
	}
	o := s.o.RLQS
	var shares rlqs.Shares
	where := "process"
	if c, prefix, ok := redisClientOf(s.store); ok {
		shares, where = rlqs.NewRedisShares(c, prefix), "redis"
	}
	s.rlqs = rlqs.New(rlqs.Options{
		Config:              s.svc.Config,
		Ledger:              s.store,
		Shares:              shares,
		DenyUnmatched:       o.RLQSUnmatched == "deny_all",
		MaxStreams:          o.RLQSMaxStreams,
		MaxBucketsPerStream: o.RLQSMaxBucketsPerStream,
		MaxBuckets:          o.RLQSMaxBuckets,
		AbandonAfter:        orNever(o.RLQSAbandonAfter),
		Hysteresis:          orNever(o.RLQSHysteresis),
		Logger:              s.log,
		Registerer:          s.reg,
	})
	s.rlqs.Register(s.grpcSrv)
	s.health.SetServingStatus(rlqs.ServiceName, healthpb.HealthCheckResponse_SERVING)
	s.log.Info("RLQS on", "shares", where, "max_streams", o.RLQSMaxStreams, "max_report_size", formatSize(uint64(o.RLQSMaxReportSize)), "unmatched", string(o.RLQSUnmatched))
}

// orNever maps a flag's 0 (never) to the service's negative.
func orNever(v int) int {
	if v == 0 {
		return -1
	}
	return v
}

// redisClientOf returns the Redis client and key prefix of a Redis store
// (the main one, with --redis-persecond-*).
func redisClientOf(st backend.Store) (goredis.UniversalClient, string, bool) {
	if sp, ok := st.(interface{ Main() backend.Store }); ok {
		st = sp.Main()
	}
	if r, ok := st.(interface {
		Client() goredis.UniversalClient
		KeyPrefix() string
	}); ok {
		return r.Client(), r.KeyPrefix(), true
	}
	return nil, "", false
}
