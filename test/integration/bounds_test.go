package integration

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/envoyrls/envoy-rls/internal/schedprobe"
	"github.com/envoyrls/envoy-rls/internal/testutil"
)

// metricValue reads the sample of name with exactly labels ("k=v") from
// p's /metrics, failing the test when there is none.
func metricValue(t *testing.T, p *proc, name string, labels ...string) float64 {
	t.Helper()
	v := testutil.Scrape(t, p.httpURL+"/metrics").Value(name, labels...)
	if v < 0 {
		t.Fatalf("no %s%v in /metrics", name, labels)
	}
	return v
}

// metricCount is metricValue with a series not made yet read as 0.
func metricCount(t *testing.T, p *proc, name string, labels ...string) float64 {
	t.Helper()
	return testutil.Scrape(t, p.httpURL+"/metrics").Count(name, labels...)
}

// TestStreamFloodOnOneConnection opens 50,000 gRPC streams on one HTTP/2
// connection without ever sending their messages, as an attacker would
// with a raw HTTP/2 client. The server announces its stream limit, refuses
// every stream beyond it (RST_STREAM REFUSED_STREAM), and its goroutines
// stay within the limit instead of growing by one per stream.
func TestStreamFloodOnOneConnection(t *testing.T) {
	const maxStreams = 100
	streams := 50_000
	if testing.Short() {
		streams = 5_000
	}
	p := startServe(t, nil, "--config", repoFile("examples", "ratelimit.yaml"), "--grpc-max-concurrent-streams", strconv.Itoa(maxStreams))
	base := metricValue(t, p, "go_goroutines")

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
	if err := fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	bw.Flush()

	// Read the server's frames: its stream limit, and every refusal.
	announced := make(chan uint32, 1)
	refused := make(chan uint32, streams)
	go func() {
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				close(refused)
				return
			}
			switch f := f.(type) {
			case *http2.SettingsFrame:
				if !f.IsAck() {
					if v, ok := f.Value(http2.SettingMaxConcurrentStreams); ok {
						select {
						case announced <- v:
						default:
						}
					}
				}
			case *http2.RSTStreamFrame:
				if f.ErrCode == http2.ErrCodeRefusedStream {
					refused <- f.StreamID
				}
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
	block := hb.Bytes()
	for i := 0; i < streams; i++ {
		err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: uint32(2*i + 1), BlockFragment: block, EndHeaders: true})
		if err != nil {
			t.Fatalf("stream %d: %v", i, err)
		}
	}
	if err := bw.Flush(); err != nil {
		t.Fatal(err)
	}
	select {
	case v := <-announced:
		if v != maxStreams {
			t.Errorf("server announced SETTINGS_MAX_CONCURRENT_STREAMS %d, want %d", v, maxStreams)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("server announced no stream limit")
	}
	n := 0
	timeout := time.After(60 * time.Second)
	for n < streams-maxStreams {
		select {
		case _, ok := <-refused:
			if !ok {
				t.Fatalf("connection closed after %d refusals", n)
			}
			n++
		case <-timeout:
			t.Fatalf("%d streams refused, want %d", n, streams-maxStreams)
		}
	}
	g := metricValue(t, p, "go_goroutines")
	t.Logf("%d streams: %d refused; goroutines %v before, %v with the connection full", streams, n, base, g)
	if g > base+2*maxStreams {
		t.Errorf("goroutines grew from %v to %v with %d streams open (limit %d)", base, g, streams, maxStreams)
	}
	// The service still answers other clients.
	if code, _ := p.postJSON(t, `{"domain":"example","descriptors":[{"entries":[{"key":"api_key","value":"flood"}]}]}`); code != 200 {
		t.Errorf("/json answered %d during the flood", code)
	}
}

// TestSlowAndIdleHTTPClientsAreClosed: a client that trickles its request
// body is cut off at --http-read-timeout, and an idle keep-alive connection
// is closed at --http-idle-timeout. The bound allowed is the timeout plus
// the scheduling delay measured meanwhile, doubled (both processes run on
// the same CPUs).
func TestSlowAndIdleHTTPClientsAreClosed(t *testing.T) {
	const timeout = time.Second
	p := startServe(t, nil, "--config", repoFile("examples", "ratelimit.yaml"),
		"--http-read-timeout", timeout.String(), "--http-idle-timeout", timeout.String())
	addr := p.httpURL[len("http://"):]

	closedWithin := func(t *testing.T, conn net.Conn, during func()) time.Duration {
		t.Helper()
		probe := schedprobe.Start()
		start := time.Now()
		closed := make(chan struct{})
		go func() {
			io.Copy(io.Discard, conn) // until the server closes it
			close(closed)
		}()
		go during()
		select {
		case <-closed:
		case <-time.After(30 * timeout):
			t.Fatalf("connection still open after %v", 30*timeout)
		}
		took := time.Since(start)
		if slack := probe.Stop(); took > 2*(timeout+slack) {
			t.Errorf("closed after %v, want about %v (measured scheduling slack %v)", took, timeout, slack)
		}
		return took
	}

	t.Run("trickled body", func(t *testing.T) {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		fmt.Fprintf(conn, "POST /json HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{")
		stop := make(chan struct{})
		defer close(stop)
		took := closedWithin(t, conn, func() {
			tick := time.NewTicker(timeout / 10)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
					if _, err := conn.Write([]byte(" ")); err != nil {
						return
					}
				}
			}
		})
		t.Logf("trickling client closed after %v", took)
	})
	t.Run("idle keep-alive", func(t *testing.T) {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		fmt.Fprintf(conn, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("healthz: %v %v", resp, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		took := closedWithin(t, conn, func() {})
		t.Logf("idle connection closed after %v", took)
	})
}
