package integration

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	be "encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/proto"

	"github.com/envoyrls/envoy-rls/internal/redistest"
	"github.com/envoyrls/envoy-rls/internal/schedprobe"
	"github.com/envoyrls/envoy-rls/internal/testutil"
)

// evictMinAge is cmd/envoy-rls's: a connection silent or idle for less is
// never evicted.
const evictMinAge = time.Second

// caller makes calls on conn one after another every interval until stop
// is called, which returns the number of calls and the errors.
func caller(conn *grpc.ClientConn, interval time.Duration) (stop func() (int, []error)) {
	client := rlsv3.NewRateLimitServiceClient(conn)
	done := make(chan struct{})
	var (
		wg    sync.WaitGroup
		calls int
		errs  []error
	)
	wg.Go(func() {
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "bounds", Descriptors: []*commonv3.RateLimitDescriptor{descriptor("blob", "x")}})
			cancel()
			calls++
			if err != nil {
				errs = append(errs, err)
			}
		}
	})
	return func() (int, []error) { close(done); wg.Wait(); return calls, errs }
}

// TestIdleHTTP2FloodDoesNotLockOut: 5,000 HTTP/2 connections that send
// the preface and nothing else, against the default 4,096 gRPC
// connections. The first 4,095 (one client holds a slot) are let age past
// the eviction minimum; each further one evicts the oldest of them with a
// GOAWAY. A client calling throughout, and one that connects after the
// flood, get every call answered; the evictions are counted and each
// evicted connection is closed. (--first-request-timeout is raised so
// that it closes none of them first.)
func TestIdleHTTP2FloodDoesNotLockOut(t *testing.T) {
	const limit, flood = 4096, 5000
	p := startBinary(t, plainBinary(t), 200, nil, "--config", boundsConfig(t), "--first-request-timeout", "10m")
	stopA := caller(p.conn, 10*time.Millisecond)
	var conns []*rawH2
	for range limit - 1 {
		conns = append(conns, dialRawH2(t, p.grpcAddr))
	}
	testutil.WaitEvery(t, procPoll, 60*time.Second, "the slots to fill", func() bool {
		return metricValue(t, p, "envoy_rls_grpc_connections") == limit
	})
	time.Sleep(evictMinAge) // the silent connections are now evictable
	for range flood - (limit - 1) {
		conns = append(conns, dialRawH2(t, p.grpcAddr))
	}
	connB, err := grpc.NewClient(p.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer connB.Close()
	stopB := caller(connB, 10*time.Millisecond)
	var evicted, refused float64
	testutil.WaitEvery(t, procPoll, 60*time.Second, "each connection beyond the limit to evict one or be refused", func() bool {
		evicted = metricValue(t, p, "envoy_rls_grpc_connections_evicted_total")
		refused = metricValue(t, p, "envoy_rls_grpc_connections_refused_total")
		return evicted+refused >= flood-(limit-1)+1 // and client B's
	})
	closed, goaway := 0, 0
	testutil.WaitEvery(t, procPoll, 60*time.Second, "the evicted and refused connections to be closed", func() bool {
		closed, goaway = 0, 0
		for _, c := range conns {
			if c.isClosed() {
				closed++
			}
			select {
			case <-c.goaway:
				goaway++
			default:
			}
		}
		return closed >= int(evicted+refused)-1
	})
	time.Sleep(500 * time.Millisecond) // calls go on after the flood
	callsA, errsA := stopA()
	callsB, errsB := stopB()
	t.Logf("%d silent connections: %v evicted, %v refused; %d closed, %d of them after a GOAWAY; client A %d calls, %d failed; client B (connected after the flood) %d calls, %d failed",
		flood, evicted, refused, closed, goaway, callsA, len(errsA), callsB, len(errsB))
	for _, errs := range [][]error{errsA, errsB} {
		for i, err := range errs {
			if i < 3 {
				t.Errorf("call failed: %v", err)
			}
		}
	}
	if evicted < 1 || goaway < int(evicted)-1 {
		t.Errorf("%v evicted, %d GOAWAYs received: want evictions, each with a GOAWAY", evicted, goaway)
	}
	if callsA < 10 || callsB < 10 {
		t.Errorf("clients made %d and %d calls, want at least 10 each", callsA, callsB)
	}
	if open := metricValue(t, p, "envoy_rls_grpc_connections"); open > limit {
		t.Errorf("%v gRPC connections open after the flood, want at most %d", open, limit)
	}
}

// TestSlowBodyWavesKeepHealthAnswering: waves of 1,100 HTTP clients that
// send a POST's headers and then trickle its body, one wave every 10 s
// (3 waves), against the default 1,024 HTTP connections. Meanwhile a
// probe asks /healthz on a new connection every 100 ms, as kubelet does,
// and gRPC health: every probe succeeds. The clients beyond the limit get
// a slot of the reserve and 503 as soon as their headers are read.
func TestSlowBodyWavesKeepHealthAnswering(t *testing.T) {
	const waves, wave, period = 3, 1100, 10 * time.Second
	p := startBinary(t, plainBinary(t), 200, nil, "--config", boundsConfig(t))
	addr := p.httpURL[len("http://"):]
	probeClient := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	health := healthpb.NewHealthClient(p.conn)
	done := make(chan struct{})
	var (
		probes, probeFails atomic.Int64
		failMu             sync.Mutex
		failures           []string
	)
	fail := func(s string) {
		probeFails.Add(1)
		failMu.Lock()
		failures = append(failures, s)
		failMu.Unlock()
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			probes.Add(1)
			resp, err := probeClient.Get(p.httpURL + "/healthz")
			if err != nil {
				fail(fmt.Sprintf("%s /healthz: %v", time.Now().Format("15:04:05.000"), err))
			} else {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					fail(fmt.Sprintf("%s /healthz: %d", time.Now().Format("15:04:05.000"), resp.StatusCode))
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			hr, err := health.Check(ctx, &healthpb.HealthCheckRequest{})
			cancel()
			if err != nil || hr.Status != healthpb.HealthCheckResponse_SERVING {
				fail(fmt.Sprintf("%s gRPC health: %v %v", time.Now().Format("15:04:05.000"), hr, err))
			}
		}
	})
	var attackers sync.WaitGroup
	var dialFailed, heldNanos, held atomic.Int64
	slowBody := func() {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			dialFailed.Add(1)
			return
		}
		defer c.Close()
		start := time.Now()
		defer func() { heldNanos.Add(int64(time.Since(start))); held.Add(1) }()
		if _, err := fmt.Fprintf(c, "POST /json HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{"); err != nil {
			return
		}
		closed := make(chan struct{})
		go func() { io.Copy(io.Discard, c); close(closed) }()
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-closed:
				return
			case <-tick.C:
				if _, err := c.Write([]byte(" ")); err != nil {
					return
				}
			}
		}
	}
	next := time.Now()
	for range waves {
		time.Sleep(time.Until(next))
		next = next.Add(period)
		for range wave {
			attackers.Go(slowBody)
		}
	}
	time.Sleep(time.Until(next))
	close(done)
	wg.Wait()
	attackers.Wait()
	reserved := metricValue(t, p, "envoy_rls_http_connections_reserved_total")
	refused := metricValue(t, p, "envoy_rls_http_connections_refused_total")
	evicted := metricValue(t, p, "envoy_rls_http_connections_evicted_total")
	t.Logf("%d waves of %d slow bodies, held for %v on average: %d probes (HTTP and gRPC), %d failed; %v connections on the reserve, %v evicted, %v refused, %d dials failed",
		waves, wave, time.Duration(heldNanos.Load()/max(held.Load(), 1)), probes.Load(), probeFails.Load(), reserved, evicted, refused, dialFailed.Load())
	for i, f := range failures {
		if i < 5 {
			t.Errorf("probe failed: %s", f)
		}
	}
	if probes.Load() < 100 {
		t.Errorf("%d probes, want at least 100", probes.Load())
	}
	if reserved < 1 {
		t.Errorf("no connection went on the reserve: the waves did not reach the limit")
	}
}

// TestSilentConnectionIsClosedAfterFirstRequestTimeout: with
// --first-request-timeout 1s, an HTTP/2 connection that sends its preface
// and no call gets a GOAWAY and is closed after about 1 s, and is counted;
// a TCP connection that sends nothing is closed too (grpc-go's
// ConnectionTimeout); a connection that made a call stays open. The bound
// allowed is the timeout plus the scheduling delay measured meanwhile,
// doubled.
func TestSilentConnectionIsClosedAfterFirstRequestTimeout(t *testing.T) {
	const timeout = time.Second
	p := startServe(t, nil, "--config", boundsConfig(t), "--first-request-timeout", timeout.String())
	probe := schedprobe.Start()
	start := time.Now()
	silent := dialRawH2(t, p.grpcAddr)
	nothing, err := net.Dial("tcp", p.grpcAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer nothing.Close()
	nothingClosed := make(chan time.Duration, 1)
	go func() { io.Copy(io.Discard, nothing); nothingClosed <- time.Since(start) }()
	used := dialRawH2(t, p.grpcAddr)
	used.partialStreams(1, 100)
	select {
	case <-silent.closed:
	case <-time.After(30 * timeout):
		t.Fatalf("silent connection still open after %v", 30*timeout)
	}
	took := time.Since(start)
	var tookNothing time.Duration
	select {
	case tookNothing = <-nothingClosed:
	case <-time.After(30 * timeout):
		t.Fatalf("connection that sent nothing still open after %v", 30*timeout)
	}
	slack := probe.Stop()
	t.Logf("silent HTTP/2 connection closed after %v, silent TCP connection after %v (scheduling slack %v)", took, tookNothing, slack)
	select {
	case <-silent.goaway:
	default:
		t.Error("the silent HTTP/2 connection was closed without a GOAWAY")
	}
	for _, d := range []time.Duration{took, tookNothing} {
		if d < timeout || d > 2*(timeout+slack) {
			t.Errorf("closed after %v, want about %v (measured scheduling slack %v)", d, timeout, slack)
		}
	}
	if used.isClosed() {
		t.Error("the connection with a call in progress was closed")
	}
	if n := metricValue(t, p, "envoy_rls_grpc_first_request_timeouts_total"); n != 1 {
		t.Errorf("%v first-request timeouts counted, want 1", n)
	}
}

// TestCallRacingAnEvictionIsServed: with --grpc-max-connections 2, a raw
// HTTP/2 connection silent for the eviction minimum age is evicted by a
// newcomer. It receives the first GOAWAY (last stream 2^31-1) and a PING,
// and only then sends a call, as a client whose call crossed the GOAWAY
// would, and answers the PING: the second GOAWAY names that call's
// stream, the call is answered OK, and the connection is closed after.
func TestCallRacingAnEvictionIsServed(t *testing.T) {
	p := startServe(t, nil, "--config", boundsConfig(t), "--grpc-max-connections", "2", "--first-request-timeout", "10m")
	conn, err := net.Dial("tcp", p.grpcAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(60 * time.Second))
	fr := http2.NewFramer(conn, conn)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	io.WriteString(conn, http2.ClientPreface)
	fr.WriteSettings()
	frames := make(chan http2.Frame, 64)
	go func() {
		defer close(frames)
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				return
			}
			if s, ok := f.(*http2.SettingsFrame); ok && !s.IsAck() {
				continue // acked below, from this goroutine's frames
			}
			frames <- f
		}
	}()
	busy := dialRawH2(t, p.grpcAddr)
	busy.partialStreams(1, 100) // a call in progress: never the victim
	testutil.WaitEvery(t, procPoll, 30*time.Second, "both slots to be taken", func() bool {
		return metricValue(t, p, "envoy_rls_grpc_connections") == 2
	})
	time.Sleep(evictMinAge) // the silent connection is now evictable
	newcomer := dialRawH2(t, p.grpcAddr)
	next := func(what string) http2.Frame {
		t.Helper()
		f, ok := <-frames
		if !ok {
			t.Fatalf("connection closed waiting for %s", what)
		}
		return f
	}
	var ping *http2.PingFrame
	for ping == nil {
		switch f := next("the GOAWAY and PING").(type) {
		case *http2.GoAwayFrame:
			if f.LastStreamID != 1<<31-1 {
				t.Fatalf("first GOAWAY names stream %d, want 2^31-1", f.LastStreamID)
			}
		case *http2.PingFrame:
			ping = f
		}
	}
	// The call crossing the GOAWAY, then the PING's answer.
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, h := range [][2]string{
		{":method", "POST"}, {":scheme", "http"}, {":authority", p.grpcAddr},
		{":path", "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"},
		{"content-type", "application/grpc"}, {"te", "trailers"},
	} {
		enc.WriteField(hpack.HeaderField{Name: h[0], Value: h[1]})
	}
	msg, err := proto.Marshal(&rlsv3.RateLimitRequest{Domain: "bounds", Descriptors: []*commonv3.RateLimitDescriptor{descriptor("blob", "x")}})
	if err != nil {
		t.Fatal(err)
	}
	body := append([]byte{0, 0, 0, 0, 0}, msg...)
	be.BigEndian.PutUint32(body[1:5], uint32(len(msg)))
	fr.WriteSettingsAck()
	fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndHeaders: true})
	fr.WriteData(1, true, body)
	fr.WritePing(true, ping.Data)
	var lastGoAway uint32 = 1<<31 - 1
	status := ""
	for f := range frames {
		switch f := f.(type) {
		case *http2.GoAwayFrame:
			lastGoAway = f.LastStreamID
		case *http2.MetaHeadersFrame:
			if f.StreamID == 1 && f.StreamEnded() {
				status = headerValue(f, "grpc-status")
			}
		case *http2.RSTStreamFrame:
			t.Errorf("stream %d reset: %v", f.StreamID, f.ErrCode)
		}
	}
	t.Logf("second GOAWAY names stream %d; the racing call ended with grpc-status %q", lastGoAway, status)
	if lastGoAway != 1 {
		t.Errorf("second GOAWAY names stream %d, want 1", lastGoAway)
	}
	if status != "0" {
		t.Errorf("racing call ended with grpc-status %q, want 0 (OK)", status)
	}
	if busy.isClosed() || newcomer.isClosed() {
		t.Errorf("the busy connection (closed: %v) or the newcomer (closed: %v) was closed", busy.isClosed(), newcomer.isClosed())
	}
	if n := metricValue(t, p, "envoy_rls_grpc_connections_evicted_total"); n != 1 {
		t.Errorf("%v evictions counted, want 1", n)
	}
}

// headerValue is the value of the header name in f, or "".
func headerValue(f *http2.MetaHeadersFrame, name string) string {
	for _, h := range f.RegularFields() {
		if h.Name == name {
			return h.Value
		}
	}
	return ""
}

// TestIdleKeepAliveIsEvictedForANewHTTPClient: with --http-max-connections
// 3 and no reserve, three keep-alive connections each make a request and
// wait idle past the eviction minimum age; two of them make another. A
// fourth client is served: the least recently active connection, the
// first, is closed for it and counted; the other two stay open.
func TestIdleKeepAliveIsEvictedForANewHTTPClient(t *testing.T) {
	p := startServe(t, nil, "--config", boundsConfig(t), "--http-max-connections", "3", "--http-reserved-connections", "0")
	httpClient.CloseIdleConnections()
	addr := p.httpURL[len("http://"):]
	once := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	testutil.WaitEvery(t, procPoll, 30*time.Second, "the start's keep-alive connection to be gone", func() bool {
		resp, err := once.Get(p.httpURL + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return regexp.MustCompile(`(?m)^envoy_rls_http_connections 1$`).Match(body) // this scrape's
	})
	get := func(c net.Conn) error {
		if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			return err
		}
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	}
	var conns []net.Conn
	closed := make([]chan struct{}, 3)
	for i := range 3 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if err := get(c); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		conns = append(conns, c)
	}
	time.Sleep(evictMinAge)       // all three idle long enough to be evicted
	for i, c := range conns[1:] { // now only the first is
		if err := get(c); err != nil {
			t.Fatalf("second request %d: %v", i+1, err)
		}
	}
	for i, c := range conns {
		closed[i] = make(chan struct{})
		c.SetReadDeadline(time.Time{})
		go func() { io.Copy(io.Discard, c); close(closed[i]) }()
	}
	resp, err := once.Get(p.httpURL + "/healthz")
	if err != nil {
		t.Fatalf("new client: %v", err)
	}
	resp.Body.Close()
	select {
	case <-closed[0]:
	case <-time.After(10 * time.Second):
		t.Fatalf("the least recently active keep-alive connection is still open (%v evicted, %v open)",
			metricValue(t, p, "envoy_rls_http_connections_evicted_total"), metricValue(t, p, "envoy_rls_http_connections"))
	}
	for i := 1; i < 3; i++ {
		select {
		case <-closed[i]:
			t.Errorf("keep-alive connection %d was closed too", i)
		default:
		}
	}
	// Scraped on a connection of its own, which the listener refuses while
	// it still counts the new client's (closed) one beside the two open:
	// polled until it sees that close.
	var evicted []byte
	testutil.WaitEvery(t, procPoll, 10*time.Second, "a scrape beside the two open connections", func() bool {
		resp, err := once.Get(p.httpURL + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		m := regexp.MustCompile(`(?m)^envoy_rls_http_connections_evicted_total (\S+)$`).FindSubmatch(body)
		if m != nil {
			evicted = m[1]
		}
		return m != nil
	})
	if n, err := strconv.ParseFloat(string(evicted), 64); err != nil || n < 1 {
		t.Errorf("%s HTTP evictions counted, want at least 1", evicted)
	}
}

// TestSilentTLSConnectionGetsGoAway: over gRPC TLS, the listener follows
// the frames inside TLS: a connection that completes its handshake, sends
// the HTTP/2 preface and no call gets a GOAWAY (encrypted, through the
// TLS connection) after --first-request-timeout and is closed, and is
// counted.
func TestSilentTLSConnectionGetsGoAway(t *testing.T) {
	files := redistest.NewTLSFiles(t)
	p := startServe(t, nil, "--config", boundsConfig(t), "--first-request-timeout", "1s",
		"--grpc-tls-cert", files.ServerCert, "--grpc-tls-key", files.ServerKey)
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(readFile(t, files.CA))
	conn, err := tls.Dial("tcp", p.grpcAddr, &tls.Config{RootCAs: roots, ServerName: "localhost", NextProtos: []string{"h2"}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	io.WriteString(conn, http2.ClientPreface)
	fr := http2.NewFramer(conn, conn)
	fr.WriteSettings()
	sawGoAway := false
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatal("silent TLS connection still open after 30 s")
			}
			break // closed
		}
		switch f := f.(type) {
		case *http2.GoAwayFrame:
			sawGoAway = true
		case *http2.PingFrame:
			if !f.IsAck() {
				fr.WritePing(true, f.Data)
			}
		}
	}
	if !sawGoAway {
		t.Error("the silent TLS connection was closed without a GOAWAY")
	}
	if n := metricValue(t, p, "envoy_rls_grpc_first_request_timeouts_total"); n != 1 {
		t.Errorf("%v first-request timeouts counted, want 1", n)
	}
}
