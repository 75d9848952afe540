package rls

import (
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
)

// HealthServiceNames are the names the gRPC health service answers for, in
// addition to the server-wide "": the rate limit service's full name, and
// "ratelimit" as the reference server uses.
var HealthServiceNames = []string{rlsv3.RateLimitService_ServiceDesc.ServiceName, "ratelimit"}

// NewGRPCServer returns a gRPC server with the rate limit service, the
// standard health service (SERVING for "" and HealthServiceNames) and server
// reflection registered. The returned health server lets the caller mark the
// service NOT_SERVING when it shuts down.
func NewGRPCServer(svc *Service, opts ...grpc.ServerOption) (*grpc.Server, *health.Server) {
	srv := grpc.NewServer(opts...)
	rlsv3.RegisterRateLimitServiceServer(srv, svc)
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	for _, name := range HealthServiceNames {
		hs.SetServingStatus(name, healthpb.HealthCheckResponse_SERVING)
	}
	healthpb.RegisterHealthServer(srv, hs)
	reflection.Register(srv)
	return srv, hs
}
