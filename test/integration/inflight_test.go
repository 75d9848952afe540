package integration

import (
	"bufio"
	"bytes"
	be "encoding/binary"
	"io"
	"net"
	"runtime"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// TestRequestsInFlightOnOneConnection opens --grpc-max-concurrent-streams
// streams (1024) on one HTTP/2 connection, as an attacker would with a raw
// client, and sends on each all but the last bytes of a request of nearly
// --grpc-max-recv-msg-size (64 KiB): the server holds them all while it
// waits for the rest. Its RSS grows by at most twice streams x size, the
// README's bound (1024 x 64 KiB = 64 MiB, about twice that decoded).
func TestRequestsInFlightOnOneConnection(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc/<pid>/status")
	}
	const streams, size = 1024, 64 << 10
	p := startBinary(t, plainBinary(t), 200, nil, "--config", boundsConfig(t))
	start := procStatusKB(t, p, "VmRSS")

	conn, err := net.Dial("tcp", p.grpcAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	bw := bufio.NewWriterSize(conn, 64<<10)
	if _, err := io.WriteString(bw, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(bw, conn)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	go func() { // read (and drop) the server's frames, so it never blocks on us
		for {
			if _, err := fr.ReadFrame(); err != nil {
				return
			}
		}
	}()
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, h := range [][2]string{
		{":method", "POST"}, {":scheme", "http"}, {":authority", p.grpcAddr},
		{":path", "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"},
		{"content-type", "application/grpc"}, {"te", "trailers"},
	} {
		enc.WriteField(hpack.HeaderField{Name: h[0], Value: h[1]})
	}
	// A gRPC message of size-5 bytes (its length prefix says so), of
	// which all but one byte is sent.
	msg := make([]byte, size-1)
	be.BigEndian.PutUint32(msg[1:5], size-5)
	// Flow control may stop the writes: give up on them after 10 s.
	conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
	sent := 0
	for i := range streams {
		id := uint32(2*i + 1)
		if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hb.Bytes(), EndHeaders: true}); err != nil {
			break
		}
		for off := 0; off < len(msg); off += 16 << 10 {
			if err := fr.WriteData(id, false, msg[off:min(off+16<<10, len(msg))]); err != nil {
				break
			}
		}
		sent += len(msg)
	}
	bw.Flush()
	waitRSSSettled(t, p)
	peak := procStatusKB(t, p, "VmHWM")
	t.Logf("%d streams, %d KiB sent: RSS %d KiB at start, peak %d KiB (+%d KiB)", streams, sent>>10, start, peak, peak-start)
	if bound := start + 2*streams*size>>10; peak > uint64(bound) {
		t.Errorf("peak RSS %d KiB, above RSS at start + 2 x streams x size = %d KiB", peak, bound)
	}
	// The service still answers.
	if code, _ := p.postJSON(t, `{"domain":"bounds","descriptors":[{"entries":[{"key":"blob","value":"x"}]}]}`); code != 200 {
		t.Errorf("/json answered %d with the connection full", code)
	}
}
