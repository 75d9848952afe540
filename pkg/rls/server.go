package rls

import (
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/envoyrls/envoy-rls/internal/grpccodec"
)

// HealthServiceNames are the names the gRPC health service answers for, in
// addition to the server-wide "": the rate limit service's full name, and
// "ratelimit" as the reference server uses.
var HealthServiceNames = []string{rlsv3.RateLimitService_ServiceDesc.ServiceName, "ratelimit"}

// NewGRPCServer returns a gRPC server with the rate limit service, the
// standard health service (SERVING for "" and HealthServiceNames) and server
// reflection registered. The returned health server lets the caller mark the
// service NOT_SERVING when it shuts down.
//
// Its codec (ServerCodec) decodes RateLimitRequest byte-exact: a domain,
// key or value that is not valid UTF-8 is decided on its bytes, never a
// decode error (which Envoy's default would let through unlimited).
func NewGRPCServer(svc *Service, opts ...grpc.ServerOption) (*grpc.Server, *health.Server) {
	srv := grpc.NewServer(append([]grpc.ServerOption{grpc.ForceServerCodecV2(svc.ServerCodec())}, opts...)...)
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

// ServerCodec returns the gRPC server codec for a server of this service
// (grpc.ForceServerCodecV2; NewGRPCServer sets it): the standard protobuf
// codec, except that RateLimitRequest is decoded byte-exact and counted in
// envoy_rls_requests_invalid_utf8_total when it holds bytes that are not
// valid UTF-8. A server built without it answers such requests Internal.
func (s *Service) ServerCodec() *grpccodec.Codec {
	return grpccodec.New(grpccodec.Options{
		InvalidUTF8: s.opts.Metrics.InvalidUTF8,
		Repaired: func(msg string, err error) {
			s.log.Error("a response could not be marshalled and was sent with its invalid UTF-8 replaced; please report it", "message", msg, "error", err)
		},
	})
}
