package integration

import (
	"bufio"
	"bytes"
	"context"
	be "encoding/binary"
	"errors"
	"io"
	"net"
	"regexp"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/envoyrls/envoy-rls/internal/schedprobe"
	"github.com/envoyrls/envoy-rls/internal/testutil"
)

// rawH2 is a raw HTTP/2 client connection to the gRPC port: preface and
// SETTINGS sent, the server's frames read in the background (its pings
// answered). closed is closed when the server closes the connection, goaway
// when it sends GOAWAY.
type rawH2 struct {
	conn   net.Conn
	mu     sync.Mutex // the framer's writes
	bw     *bufio.Writer
	fr     *http2.Framer
	block  []byte
	closed chan struct{}
	goaway chan struct{}
}

func dialRawH2(t *testing.T, addr string) *rawH2 {
	t.Helper()
	c := &rawH2{closed: make(chan struct{}), goaway: make(chan struct{})}
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		// A connection the server refused may be reset before the dial
		// returns.
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Fatal(err)
		}
		close(c.closed)
		conn = nopConn{}
	}
	t.Cleanup(func() { conn.Close() })
	c.conn, c.bw = conn, bufio.NewWriterSize(conn, 64<<10)
	c.fr = http2.NewFramer(c.bw, conn)
	// Writes to a connection the server refused may fail: that is seen
	// in closed.
	io.WriteString(c.bw, http2.ClientPreface)
	c.fr.WriteSettings()
	c.bw.Flush()
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, h := range [][2]string{
		{":method", "POST"}, {":scheme", "http"}, {":authority", addr},
		{":path", "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"},
		{"content-type", "application/grpc"}, {"te", "trailers"},
	} {
		enc.WriteField(hpack.HeaderField{Name: h[0], Value: h[1]})
	}
	c.block = hb.Bytes()
	if c.isClosed() {
		return c
	}
	pings := make(chan [8]byte, 16)
	go func() {
		defer close(c.closed)
		sawGoaway := false
		for {
			f, err := c.fr.ReadFrame()
			if err != nil {
				return
			}
			switch f := f.(type) {
			case *http2.GoAwayFrame:
				if !sawGoaway {
					sawGoaway = true
					close(c.goaway)
				}
			case *http2.PingFrame:
				if !f.IsAck() {
					select {
					case pings <- f.Data:
					default:
					}
				}
			}
		}
	}()
	go func() { // answer the server's pings
		for {
			select {
			case d := <-pings:
				c.mu.Lock()
				c.fr.WritePing(true, d)
				c.bw.Flush()
				c.mu.Unlock()
			case <-c.closed:
				return
			}
		}
	}()
	return c
}

// nopConn stands for a connection reset while it was dialled: writes fail.
type nopConn struct{ net.Conn }

func (nopConn) Write([]byte) (int, error)        { return 0, syscall.ECONNRESET }
func (nopConn) Close() error                     { return nil }
func (nopConn) SetWriteDeadline(time.Time) error { return nil }

// partialStreams opens n streams and sends on each all but the last byte of
// a gRPC message of size bytes, as TestRequestsInFlightOnOneConnection does;
// it returns the bytes sent.
func (c *rawH2) partialStreams(n, size int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	msg := make([]byte, size-1)
	be.BigEndian.PutUint32(msg[1:5], uint32(size-5))
	c.conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
	sent := 0
	for i := range n {
		id := uint32(2*i + 1)
		if c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.block, EndHeaders: true}) != nil {
			break
		}
		for off := 0; off < len(msg); off += 16 << 10 {
			if c.fr.WriteData(id, false, msg[off:min(off+16<<10, len(msg))]) != nil {
				return sent
			}
		}
		sent += len(msg)
	}
	if c.bw.Flush() != nil {
		return 0
	}
	return sent
}

// isClosed reports whether the server has closed the connection.
func (c *rawH2) isClosed() bool {
	select {
	case <-c.closed:
		return true
	default:
		return false
	}
}

// TestConnectionsBeyondTheLimitAreClosed: with --grpc-max-connections 4 and
// one gRPC client connected, 40 more raw connections are opened: 3 are
// served, the other 37 are closed at once (and counted: refused, or, where
// the dials took longer than the eviction minimum age, evicting an older
// raw one), and calls on the first connection go on.
func TestConnectionsBeyondTheLimitAreClosed(t *testing.T) {
	const limit, extra = 4, 40
	p := startServe(t, nil, "--config", boundsConfig(t), "--grpc-max-connections", strconv.Itoa(limit), "--first-request-timeout", "10m")
	call := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := p.client().ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "bounds", Descriptors: []*commonv3.RateLimitDescriptor{descriptor("blob", "x")}})
		return err
	}
	if err := call(); err != nil {
		t.Fatal(err)
	}
	var conns []*rawH2
	for range extra {
		conns = append(conns, dialRawH2(t, p.grpcAddr))
	}
	testutil.WaitEvery(t, procPoll, 30*time.Second, "the connections beyond the limit to be closed", func() bool {
		n := 0
		for _, c := range conns {
			if c.isClosed() {
				n++
			}
		}
		return n >= extra-(limit-1)
	})
	open := 0
	for _, c := range conns {
		if !c.isClosed() {
			open++
		}
	}
	refused := metricValue(t, p, "envoy_rls_grpc_connections_refused_total")
	evicted := metricValue(t, p, "envoy_rls_grpc_connections_evicted_total")
	now := metricValue(t, p, "envoy_rls_grpc_connections")
	t.Logf("%d connections beyond one client's: %d still open, %v refused, %v evicted, %v open by the metric", extra, open, refused, evicted, now)
	if open != limit-1 || refused+evicted != extra-(limit-1) || now != limit {
		t.Errorf("%d raw connections open, %v refused + %v evicted, gauge %v; want %d, %d, %d", open, refused, evicted, now, limit-1, extra-(limit-1), limit)
	}
	for i := range 20 {
		if err := call(); err != nil {
			t.Fatalf("call %d on the first connection: %v", i, err)
		}
	}
	// A slot given back is taken again.
	for _, c := range conns {
		if !c.isClosed() {
			c.conn.Close()
			break
		}
	}
	testutil.WaitEvery(t, procPoll, 30*time.Second, "the gauge to drop", func() bool { return metricValue(t, p, "envoy_rls_grpc_connections") == limit-1 })
	if c := dialRawH2(t, p.grpcAddr); func() bool {
		select {
		case <-c.closed:
			return true
		case <-time.After(time.Second):
			return false
		}
	}() {
		t.Error("a connection within the limit again was closed")
	}
}

// TestIdleGRPCConnectionIsClosed: a connection without calls gets a GOAWAY
// after --grpc-max-connection-idle and is closed a second later; the bounds
// allowed are these times plus the scheduling delay measured meanwhile,
// doubled.
func TestIdleGRPCConnectionIsClosed(t *testing.T) {
	const idle = time.Second
	p := startServe(t, nil, "--config", boundsConfig(t), "--grpc-max-connection-idle", idle.String())
	probe := schedprobe.Start()
	start := time.Now()
	c := dialRawH2(t, p.grpcAddr)
	select {
	case <-c.goaway:
	case <-time.After(30 * idle):
		t.Fatalf("no GOAWAY after %v", 30*idle)
	}
	goaway := time.Since(start)
	select {
	case <-c.closed:
	case <-time.After(30 * idle):
		t.Fatalf("connection still open %v after its GOAWAY", 30*idle)
	}
	took := time.Since(start)
	slack := probe.Stop()
	t.Logf("idle connection: GOAWAY after %v, closed after %v (scheduling slack %v)", goaway, took, slack)
	if goaway < idle || goaway > 2*(idle+slack) {
		t.Errorf("GOAWAY after %v, want about %v (measured scheduling slack %v)", goaway, idle, slack)
	}
	// grpc-go closes the connection a second after its GOAWAY unless the
	// client closed it first.
	if after := took - goaway; after > 2*(time.Second+slack) {
		t.Errorf("closed %v after the GOAWAY, want about 1s (measured scheduling slack %v)", after, slack)
	}
}

// TestPartialStreamsOnManyConnections is the attack of F4: 8 connections
// each open 256 streams holding all but the last byte of a 64 KiB request.
// With --grpc-max-connections 2 only two are served: the RSS grows by at
// most the README's process-wide bound, connections × streams × size × 2
// (2 × 256 × 64 KiB × 2 = 64 MiB), where all eight would take about 160 MiB.
func TestPartialStreamsOnManyConnections(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc/<pid>/status")
	}
	const conns, limit, streams, size = 8, 2, 256, 64 << 10
	p := startBinary(t, plainBinary(t), 200, nil, "--config", boundsConfig(t),
		"--grpc-max-connections", strconv.Itoa(limit), "--grpc-max-concurrent-streams", strconv.Itoa(streams))
	start := procStatusKB(t, p, "VmRSS")
	sent := 0
	for range conns {
		sent += dialRawH2(t, p.grpcAddr).partialStreams(streams, size)
	}
	waitRSSSettled(t, p)
	peak := procStatusKB(t, p, "VmHWM")
	refused := metricValue(t, p, "envoy_rls_grpc_connections_refused_total")
	t.Logf("%d connections x %d streams, %d KiB accepted by the kernel: %v refused; RSS %d KiB at start, peak %d KiB (+%d KiB)",
		conns, streams, sent>>10, refused, start, peak, peak-start)
	if refused != conns-limit {
		t.Errorf("%v connections refused, want %d", refused, conns-limit)
	}
	if bound := start + 2*limit*streams*size>>10; peak > uint64(bound) {
		t.Errorf("peak RSS %d KiB, above RSS at start + 2 x connections x streams x size = %d KiB", peak, bound)
	}
	if code, _ := p.postJSON(t, `{"domain":"bounds","descriptors":[{"entries":[{"key":"blob","value":"x"}]}]}`); code != 200 {
		t.Errorf("/json answered %d with the connections full", code)
	}
}

// TestHTTPConnectionsBeyondTheLimitAreClosed: with --http-max-connections 4
// and no reserve, 30 idle connections to the HTTP port: all but 4 (3 if the
// test client's keep-alive connection still holds a slot) are closed at
// once, long before the header timeout would close them, and counted; once
// they are gone the port answers again.
func TestHTTPConnectionsBeyondTheLimitAreClosed(t *testing.T) {
	const limit, extra = 4, 30
	p := startServe(t, nil, "--config", boundsConfig(t), "--http-max-connections", strconv.Itoa(limit), "--http-reserved-connections", "0")
	httpClient.CloseIdleConnections()
	addr := p.httpURL[len("http://"):]
	probe := schedprobe.Start()
	start := time.Now()
	var conns []net.Conn
	closed := make(chan struct{}, extra)
	for range extra {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			if !errors.Is(err, syscall.ECONNRESET) {
				t.Fatal(err)
			}
			closed <- struct{}{}
			continue
		}
		conns = append(conns, c)
		go func() {
			io.Copy(io.Discard, c) // until the server closes it
			closed <- struct{}{}
		}()
	}
	for range extra - limit {
		select {
		case <-closed:
		case <-time.After(30 * time.Second):
			t.Fatal("connections beyond the limit still open after 30 s")
		}
	}
	took, slack := time.Since(start), probe.Stop()
	t.Logf("%d of %d connections closed after %v (scheduling slack %v)", extra-limit, extra, took, slack)
	if took > 2*(time.Second+slack) {
		t.Errorf("the connections beyond the limit were closed after %v, want at once (measured scheduling slack %v)", took, slack)
	}
	for _, c := range conns {
		c.Close()
	}
	var refused float64
	failed := 0 // scrapes refused while the server had not yet seen the closes
	testutil.WaitEvery(t, procPoll, 30*time.Second, "the HTTP port to answer again", func() bool {
		resp, err := httpClient.Get(p.httpURL + "/metrics")
		if err != nil {
			failed++
			return false
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		m := regexp.MustCompile(`(?m)^envoy_rls_http_connections_refused_total (\S+)$`).FindSubmatch(body)
		if m == nil {
			t.Fatal("no envoy_rls_http_connections_refused_total in /metrics")
		}
		refused, _ = strconv.ParseFloat(string(m[1]), 64)
		return true
	})
	t.Logf("%v refused by the metric, %d scrapes failed", refused, failed)
	if refused < extra-limit || refused > float64(extra-limit+1+failed) {
		t.Errorf("%v connections refused, want %d (one more while a keep-alive connection held a slot, and the %d failed scrapes)", refused, extra-limit, failed)
	}
}
