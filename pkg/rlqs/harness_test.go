package rlqs

import (
	"context"
	"io"
	"log/slog"

	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/envoyrls/envoy-rls/internal/grpccodec"
	"github.com/envoyrls/envoy-rls/internal/rlqstest"
	"github.com/envoyrls/envoy-rls/internal/testutil"
	"github.com/envoyrls/envoy-rls/pkg/backend/memory"
	"github.com/envoyrls/envoy-rls/pkg/descriptors"
)

// harness is an RLQS service on a loopback port with a manual clock, and
// Envoy-like clients that report when the test says.
type harness struct {
	t     *testing.T
	clock *testutil.Clock
	svc   *Service
	addr  string
	cfg   *descriptors.Config
	hosts int
}

// newHarness serves doc (one domain's YAML) with o (Config, Now and, unless
// set, Ledger filled in).
func newHarness(t *testing.T, doc string, o Options) *harness {
	t.Helper()
	cfg, err := descriptors.ParseDocumentsWith([]descriptors.Document{{File: "q.yaml", Data: []byte(doc)}}, descriptors.Options{OrderFree: true})
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, clock: testutil.NewClock(testutil.Base), cfg: cfg}
	o.Config = func() *descriptors.Config { return h.cfg }
	o.Now = h.clock.Now
	if o.Logger == nil {
		w := &testWriter{t: t}
		t.Cleanup(func() { w.mu.Lock(); w.done = true; w.mu.Unlock() }) // runs last
		o.Logger = slog.New(slog.NewTextHandler(w, nil))
	}
	if o.Ledger == nil {
		store := memory.New(memory.WithClock(h.clock))
		t.Cleanup(func() { store.Close() })
		o.Ledger = store
	}
	if o.Shares == nil {
		o.Shares = NewMemoryShares(h.clock.Now)
	}
	h.svc = New(o)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// The server's codec, as rls.NewGRPCServer sets it: reports decoded
	// byte-exact.
	srv := grpc.NewServer(grpc.ForceServerCodecV2(grpccodec.New(grpccodec.Options{})))
	h.svc.Register(srv)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(func() {
		h.svc.Shutdown()
		srv.Stop()
		h.svc.Close()
	})
	h.addr = lis.Addr().String()
	return h
}

// conn dials the service from its own loopback address (127.0.0.2, .3,
// ...), so that each client is a host of its own.
func (h *harness) conn() *grpc.ClientConn {
	h.t.Helper()
	h.hosts++
	local := &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(1+h.hosts))}
	return dial(h.t, h.addr, local)
}

func dial(t *testing.T, addr string, local *net.TCPAddr) *grpc.ClientConn {
	t.Helper()
	d := net.Dialer{LocalAddr: local}
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) { return d.DialContext(ctx, "tcp", a) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// client returns an Envoy-like client of domain that reports only when
// the test calls report.
func (h *harness) client(domain string) *rlqstest.Client {
	h.t.Helper()
	c := rlqstest.New(rlqstest.Options{Conn: h.conn(), Domain: domain, Period: time.Hour, Now: h.clock.Now})
	h.t.Cleanup(c.Close)
	return c
}

// request makes a client's first request of a bucket (or any request) and
// waits for the response a new bucket gets.
func (h *harness) subscribe(c *rlqstest.Client, id map[string]string) {
	h.t.Helper()
	n := c.ResponseCount()
	c.Request(id)
	h.waitResponse(c, n)
}

// report sends a periodic report and waits for its response.
func (h *harness) report(c *rlqstest.Client) {
	h.t.Helper()
	n := c.ResponseCount()
	c.Report()
	h.waitResponse(c, n)
}

func (h *harness) waitResponse(c *rlqstest.Client, n int) {
	h.t.Helper()
	testutil.WaitFor(h.t, 10*time.Second, "an RLQS response", func() bool { return c.ResponseCount() > n })
}

// offer makes n requests of bucket id at the current instant and returns
// how many were allowed.
func offer(c *rlqstest.Client, id map[string]string, n int) int {
	allowed := 0
	for range n {
		if c.Request(id) {
			allowed++
		}
	}
	return allowed
}

func bucketID(kv ...string) map[string]string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

func approx(got, want, tol float64) bool { return got >= want-tol && got <= want+tol }

func rates(cs []*rlqstest.Client, id map[string]string) []float64 {
	out := make([]float64, len(cs))
	for i, c := range cs {
		out[i] = c.Bucket(id).Rate
	}
	return out
}

func sum(v []float64) float64 {
	s := 0.0
	for _, x := range v {
		s += x
	}
	return s
}

func testutil_wait(t *testing.T, cond func() bool) {
	t.Helper()
	testutil.WaitFor(t, 10*time.Second, "the condition", cond)
}

// testWriter sends log lines to the test's log until the test is over.
type testWriter struct {
	t    *testing.T
	mu   sync.Mutex
	done bool
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimSuffix(string(p), "\n"))
	}
	return len(p), nil
}

func slogTo(w io.Writer) *slog.Logger { return slog.New(slog.NewTextHandler(w, nil)) }
