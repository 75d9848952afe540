package main

import (
	"bytes"
	"context"
	"io"
	"math/rand/v2"
	"net"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// TestFrameScannerInPieces: the client preface and a run of frames, fed
// in pieces of random sizes (one byte up), give each frame's header and a
// PING's payload, whatever the cuts.
func TestFrameScannerInPieces(t *testing.T) {
	var buf bytes.Buffer
	io.WriteString(&buf, http2.ClientPreface)
	fr := http2.NewFramer(&buf, nil)
	fr.WriteSettings()
	fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: []byte("abc"), EndHeaders: true})
	fr.WriteData(1, true, make([]byte, 20000))
	fr.WritePing(true, goAwayPing)
	fr.WriteRSTStream(3, http2.ErrCodeCancel)
	fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 5, BlockFragment: make([]byte, 300), EndHeaders: true, EndStream: true})
	want := []frameHeader{
		{typ: h2FrameSettings},
		{typ: h2FrameHeaders, flags: 0x4, stream: 1},
		{typ: h2FrameData, flags: h2FlagEndStream, stream: 1},
		{typ: h2FramePing, flags: h2FlagAck, ping: goAwayPing},
		{typ: h2FrameRSTStream, stream: 3},
		{typ: h2FrameHeaders, flags: 0x5, stream: 5},
	}
	wire := buf.Bytes()
	for run := range 200 {
		var got []frameHeader
		s := frameScanner{preface: h2ClientPreface}
		for b := wire; len(b) > 0; {
			k := 1 + rand.IntN(min(len(b), 1+run*50))
			s.scan(b[:k], func(f frameHeader) { got = append(got, f) })
			b = b[k:]
		}
		if len(got) != len(want) || !s.atBoundary() {
			t.Fatalf("run %d: %d frames %+v (at a boundary: %v), want %+v", run, len(got), got, s.atBoundary(), want)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("run %d: frame %d is %+v, want %+v", run, i, got[i], want[i])
			}
		}
	}
}

// BenchmarkCallsThroughTrackedListener: sequential gRPC health calls over
// loopback, the server's listener plain or a limitListener following each
// connection's frames (each call makes it busy, then idle, under the
// listener's lock).
func BenchmarkCallsThroughTrackedListener(b *testing.B) {
	for _, tracked := range []bool{false, true} {
		b.Run(map[bool]string{false: "plain", true: "tracked"}[tracked], func(b *testing.B) {
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			if tracked {
				lis = grpcConnListener(lis, 16, time.Minute, false)
			}
			srv := grpc.NewServer()
			healthpb.RegisterHealthServer(srv, health.NewServer())
			go srv.Serve(lis)
			defer srv.Stop()
			conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close()
			client := healthpb.NewHealthClient(conn)
			ctx := context.Background()
			if _, err := client.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if _, err := client.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
