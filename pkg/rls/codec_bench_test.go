package rls_test

import (
	"context"
	"net"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	protocodec "google.golang.org/grpc/encoding/proto"

	"github.com/envoyrls/envoy-rls/pkg/rls"
)

// BenchmarkGRPCCodec measures whole calls (one caller, 10,000 keys, memory
// store) through the server's byte-exact codec and through grpc-go's
// standard one (which answers Internal to a request holding invalid UTF-8):
// the codec must not cost the hot path anything.
func BenchmarkGRPCCodec(b *testing.B) {
	for _, bc := range []struct {
		name string
		opts []grpc.ServerOption
	}{
		{"grpccodec", nil},
		{"proto", []grpc.ServerOption{grpc.ForceServerCodecV2(encoding.GetCodecV2(protocodec.Name))}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			srv, _ := rls.NewGRPCServer(benchService(b), bc.opts...)
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			go srv.Serve(lis)
			defer srv.Stop()
			conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close()
			client := rlsv3.NewRateLimitServiceClient(conn)
			reqs := benchRequests("user", 10_000)
			ctx := context.Background()
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if _, err := client.ShouldRateLimit(ctx, reqs[i%len(reqs)]); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
	}
}
