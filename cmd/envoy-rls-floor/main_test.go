package main

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/envoyrls/envoy-rls/internal/testutil"
)

// The floor answers OK to any request, even one a real service would
// refuse, and stops when its context ends.
func TestFloorAnswersOKWithoutLooking(t *testing.T) {
	addr := testutil.FreeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"--addr", addr}, io.Discard) }()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	client := rlsv3.NewRateLimitServiceClient(cc)
	for _, req := range []*rlsv3.RateLimitRequest{
		{Domain: "any", Descriptors: []*commonv3.RateLimitDescriptor{{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}},
		{}, // no domain, no descriptors: invalid for a real service
	} {
		cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
		resp, err := client.ShouldRateLimit(cctx, req, grpc.WaitForReady(true))
		ccancel()
		if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("ShouldRateLimit(%v) = %v, %v; want OK", req, resp, err)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run returned %v after its context ended", err)
	}
}

func TestFloorRefusesBadFlags(t *testing.T) {
	var out strings.Builder
	if err := run(context.Background(), []string{"--nope"}, &out); err == nil {
		t.Fatal("an unknown flag was accepted")
	}
}
