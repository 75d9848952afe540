package main

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"net/http"
	"strconv"
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

// The floor serves calls on as many stream workers as envoy-rls does by
// default, so the bench compares like with like (see the package doc).
func TestFloorRunsEnvoyRLSsStreamWorkers(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "../../cmd/envoy-rls/bounds.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	obj := f.Scope.Lookup("defaultGRPCStreamWorkers")
	if obj == nil {
		t.Fatal("cmd/envoy-rls/bounds.go declares no defaultGRPCStreamWorkers")
	}
	spec := obj.Decl.(*ast.ValueSpec)
	lit, ok := spec.Values[0].(*ast.BasicLit)
	if !ok {
		t.Fatalf("defaultGRPCStreamWorkers is not a literal: %T", spec.Values[0])
	}
	if want := strconv.Itoa(DefaultStreamWorkers); lit.Value != want {
		t.Fatalf("envoy-rls runs %s stream workers by default, the floor %s", lit.Value, want)
	}
	var out strings.Builder
	if err := run(context.Background(), []string{"--grpc-stream-workers", "70000"}, &out); err == nil {
		t.Fatal("--grpc-stream-workers 70000 was accepted")
	}
}

// --debug-addr serves a CPU profile of the floor, to be set beside
// envoy-rls's (its --debug-addr) under the same load.
func TestFloorServesItsProfile(t *testing.T) {
	addr, debug := testutil.FreeAddr(t), testutil.FreeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"--addr", addr, "--debug-addr", debug}, io.Discard) }()
	var resp *http.Response
	var err error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if resp, err = http.Get("http://" + debug + "/debug/pprof/profile?seconds=1"); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || len(body) == 0 {
		t.Fatalf("profile: status %d, %d bytes, %v", resp.StatusCode, len(body), err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run returned %v after its context ended", err)
	}
}
