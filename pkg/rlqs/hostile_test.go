package rlqs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"strings"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/envoyrls/envoy-rls/internal/testutil"
)

type rawStream = grpc.BidiStreamingClient[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse]

// raw opens a stream that sends what the test says.
func (h *harness) raw() rawStream {
	h.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	h.t.Cleanup(cancel)
	st, err := rlqsv3.NewRateLimitQuotaServiceClient(h.conn()).StreamRateLimitQuotas(ctx)
	if err != nil {
		h.t.Fatal(err)
	}
	return st
}

func usage(kv map[string]string, allowed uint64) *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage {
	return &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{BucketId: &rlqsv3.BucketId{Bucket: kv}, NumRequestsAllowed: allowed}
}

func exchange(t *testing.T, st rawStream, r *rlqsv3.RateLimitQuotaUsageReports) *rlqsv3.RateLimitQuotaResponse {
	t.Helper()
	if err := st.Send(r); err != nil {
		t.Fatal(err)
	}
	resp, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func blanketOf(a *rlqsv3.RateLimitQuotaResponse_BucketAction) (typev3.RateLimitStrategy_BlanketRule, bool) {
	s := a.GetQuotaAssignmentAction().GetRateLimitStrategy()
	_, ok := s.GetStrategy().(*typev3.RateLimitStrategy_BlanketRule_)
	return s.GetBlanketRule(), ok
}

// TestUnknownDomainAndUnmatched: buckets of a domain the config does not
// have, or that match no descriptor, get the unmatched default; unlimited
// and shadow_mode descriptors ALLOW_ALL, requests_per_unit 0 DENY_ALL.
func TestUnknownDomainAndUnmatched(t *testing.T) {
	doc := `
domain: q
descriptors:
  - key: free
    rate_limit: {unlimited: true}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: blocked
    rate_limit: {unit: second, requests_per_unit: 0}
`
	for _, deny := range []bool{false, true} {
		h := newHarness(t, doc, Options{DenyUnmatched: deny})
		unmatched := typev3.RateLimitStrategy_ALLOW_ALL
		if deny {
			unmatched = typev3.RateLimitStrategy_DENY_ALL
		}
		for _, tc := range []struct {
			domain string
			id     map[string]string
			want   typev3.RateLimitStrategy_BlanketRule
		}{
			{"nope", bucketID("free", "x"), unmatched},
			{"q", bucketID("other", "x"), unmatched},
			{"q", bucketID("free", "x", "more", "y"), unmatched},
			{"q", bucketID("free", "x"), typev3.RateLimitStrategy_ALLOW_ALL},
			{"q", bucketID("shadow", "x"), typev3.RateLimitStrategy_ALLOW_ALL},
			{"q", bucketID("blocked", "x"), typev3.RateLimitStrategy_DENY_ALL},
		} {
			st := h.raw()
			resp := exchange(t, st, &rlqsv3.RateLimitQuotaUsageReports{Domain: tc.domain, BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(tc.id, 1)}})
			acts := resp.GetBucketAction()
			if len(acts) != 1 {
				t.Fatalf("%s %v: %d actions", tc.domain, tc.id, len(acts))
			}
			rule, ok := blanketOf(acts[0])
			if !ok || rule != tc.want || acts[0].GetQuotaAssignmentAction().GetAssignmentTimeToLive().GetSeconds() < 1 {
				t.Errorf("deny=%v %s %v: got %v, want blanket %v with a TTL", deny, tc.domain, tc.id, acts[0], tc.want)
			}
		}
	}
}

// TestHostileIDs: an empty bucket id is ignored (Envoy skips actions for
// one), one over the size bounds is denied (not the unmatched default: a
// padded header must not escape its limit) and not kept, and neither
// disturbs the well-formed bucket beside it.
func TestHostileIDs(t *testing.T) {
	h := newHarness(t, perSecond30, Options{})
	st := h.raw()
	huge := bucketID("user", strings.Repeat("x", MaxBucketIDBytes))
	many := map[string]string{}
	for i := range MaxBucketEntries + 1 {
		many[fmt.Sprintf("k%d", i)] = "v"
	}
	resp := exchange(t, st, &rlqsv3.RateLimitQuotaUsageReports{Domain: "q", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
		usage(nil, 1), usage(map[string]string{}, 1), usage(huge, 1), usage(many, 1), usage(bucketID("user", "ok"), 1),
	}})
	var tb, blanket int
	for _, a := range resp.GetBucketAction() {
		if len(a.GetBucketId().GetBucket()) == 0 {
			t.Fatalf("an action for an empty id: %v", a)
		}
		if rule, ok := blanketOf(a); ok {
			if rule != typev3.RateLimitStrategy_DENY_ALL {
				t.Fatalf("an oversized id got %v", a)
			}
			blanket++
		} else if a.GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket() != nil {
			tb++
		}
	}
	if tb != 1 || blanket != 2 || h.svc.Buckets() != 1 {
		t.Fatalf("%d token buckets, %d blanket rules, %d buckets kept; want 1, 2 and 1", tb, blanket, h.svc.Buckets())
	}
}

// TestStreamErrors: a stream without a domain, or one changing its domain,
// ends with INVALID_ARGUMENT; other streams are not affected.
func TestStreamErrors(t *testing.T) {
	h := newHarness(t, perSecond30, Options{})
	good := h.client("q")
	id := bucketID("user", "u")
	h.subscribe(good, id)
	for _, msgs := range [][]*rlqsv3.RateLimitQuotaUsageReports{
		{{BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(id, 1)}}},
		{{Domain: "q"}, {Domain: "other"}},
	} {
		st := h.raw()
		for _, m := range msgs {
			_ = st.Send(m)
		}
		var err error
		for err == nil {
			_, err = st.Recv()
		}
		if status.Code(err) != codes.InvalidArgument {
			t.Fatalf("got %v, want InvalidArgument", err)
		}
	}
	h.clock.Advance(time.Second)
	h.report(good)
	if !good.Bucket(id).Assigned {
		t.Fatal("the good stream lost its assignment")
	}
	// A report that names no domain after the first is fine (gRPC's
	// planned client sends it only first), and an empty report is answered
	// with nothing.
	st := h.raw()
	exchange(t, st, &rlqsv3.RateLimitQuotaUsageReports{Domain: "q", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(id, 1)}})
	if err := st.Send(&rlqsv3.RateLimitQuotaUsageReports{}); err != nil {
		t.Fatal(err)
	}
	resp := exchange(t, st, &rlqsv3.RateLimitQuotaUsageReports{BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(id, 1)}})
	if len(resp.GetBucketAction()) != 1 {
		t.Fatalf("a report without the domain: %v", resp)
	}
}

// TestStreamBounds: streams past MaxStreams are refused with
// RESOURCE_EXHAUSTED; buckets past MaxBucketsPerStream (and MaxBuckets of
// all streams) are abandoned; a stream that sends nothing is closed after
// the idle timeout. The streams within the bounds keep being served.
func TestStreamBounds(t *testing.T) {
	// The reporting streams below report every 50 ms; an idle timeout of a
	// second leaves room for a loaded machine's scheduling delays (a race
	// build under load has shown gaps of a few hundred ms).
	const idle = time.Second
	h := newHarness(t, perSecond30, Options{MaxStreams: 2, MaxBucketsPerStream: 3, MaxBuckets: 5, IdleTimeout: idle})
	a, b := h.raw(), h.raw()
	report := func(st rawStream, n, from int) *rlqsv3.RateLimitQuotaResponse {
		r := &rlqsv3.RateLimitQuotaUsageReports{Domain: "q"}
		for i := range n {
			r.BucketQuotaUsages = append(r.BucketQuotaUsages, usage(bucketID("user", fmt.Sprint(from+i)), 1))
		}
		return exchange(t, st, r)
	}
	abandons := func(resp *rlqsv3.RateLimitQuotaResponse) int {
		n := 0
		for _, a := range resp.GetBucketAction() {
			if a.GetAbandonAction() != nil {
				n++
			}
		}
		return n
	}
	if n := abandons(report(a, 5, 0)); n != 2 {
		t.Fatalf("5 buckets on a stream of at most 3: %d abandoned, want 2", n)
	}
	if n := abandons(report(b, 3, 100)); n != 1 {
		t.Fatalf("3 more buckets with 5 in all at most: %d abandoned, want 1", n)
	}
	c := h.raw()
	_ = c.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "q"})
	if _, err := c.Recv(); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a third stream: %v, want ResourceExhausted", err)
	}
	// a and b keep reporting; a third stream that never reports is closed.
	testutil.WaitFor(t, 5*time.Second, "a stream slot", func() bool { return h.svc.Streams() == 2 })
	stop := time.Now().Add(2 * idle)
	for time.Now().Before(stop) {
		report(a, 3, 0)
		report(b, 2, 100)
		time.Sleep(50 * time.Millisecond)
	}
	d := h.raw()
	// The server may refuse the stream before the message is sent: Send
	// then says io.EOF and Recv gives the status.
	if err := d.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "q"}); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	_, err := d.Recv()
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("while a and b report: %v", err)
	}
	a.CloseSend()
	b.CloseSend()
	testutil.WaitFor(t, 5*time.Second, "the streams to end", func() bool { return h.svc.Streams() == 0 && h.svc.Buckets() == 0 })
	e := h.raw()
	if _, err := e.Recv(); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("a silent stream: %v, want DeadlineExceeded", err)
	}
}

// TestThousandsOfBuckets: one report of 5,000 buckets is answered in one
// response, and memory stays bounded once the stream ends.
func TestThousandsOfBuckets(t *testing.T) {
	h := newHarness(t, perSecond30, Options{})
	st := h.raw()
	r := &rlqsv3.RateLimitQuotaUsageReports{Domain: "q"}
	for i := range 5000 {
		r.BucketQuotaUsages = append(r.BucketQuotaUsages, usage(bucketID("user", fmt.Sprint(i)), 1))
	}
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	resp := exchange(t, st, r)
	if len(resp.GetBucketAction()) != 5000 || h.svc.Buckets() != 5000 {
		t.Fatalf("%d actions, %d buckets", len(resp.GetBucketAction()), h.svc.Buckets())
	}
	for _, a := range resp.GetBucketAction() {
		if a.GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket().GetTokensPerFill() == nil {
			t.Fatalf("not a token bucket: %v", a)
		}
	}
	_ = st.CloseSend()
	testutil.WaitFor(t, 5*time.Second, "the stream to end", func() bool { return h.svc.Streams() == 0 })
	// Past the TTL the shares are swept.
	h.clock.Advance(time.Minute)
	h.svc.shares.(interface{ Sweep() }).Sweep()
	h.svc.chargeRates(h.clock.Now(), time.Second)
	h.svc.chargeRates(h.clock.Now(), time.Second)
	if n := len(h.svc.shares.(*memoryShares).b); n != 0 {
		t.Fatalf("%d buckets left in the shares", n)
	}
	h.svc.aggMu.Lock()
	left := len(h.svc.aggs)
	h.svc.aggMu.Unlock()
	if left != 0 {
		t.Fatalf("%d buckets left in the ledger", left)
	}
}

// rawCodec sends and receives messages as the bytes they are, so a test
// can send what no protobuf library would encode.
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}

// TestNonUTF8BucketID: Envoy builds bucket ids from headers, which may
// hold any byte, and its protobuf sends them as they are; protobuf-go
// would refuse such a report (the stream would fail, every bucket of it
// unassigned). The service decides the bucket on its bytes, against the
// descriptor it matches, and echoes the id byte-exact, so Envoy finds its
// bucket.
func TestNonUTF8BucketID(t *testing.T) {
	reg := prometheus.NewRegistry()
	h := newHarness(t, `
domain: q
descriptors:
  - key: user
    detailed_metric: true
    rate_limit: {unit: second, requests_per_unit: 30}
`, Options{Registerer: reg})
	cc := h.conn()
	desc := &grpc.StreamDesc{StreamName: "StreamRateLimitQuotas", ServerStreams: true, ClientStreams: true}
	st, err := cc.NewStream(context.Background(), desc, rlqsv3.RateLimitQuotaService_StreamRateLimitQuotas_FullMethodName, grpc.ForceCodecV2(rawCodec{}))
	if err != nil {
		t.Fatal(err)
	}
	entry := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "user")
	entry = protowire.AppendString(protowire.AppendTag(entry, 2, protowire.BytesType), "\xffbob\xc3")
	id := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), entry)
	u := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), id)
	u = protowire.AppendVarint(protowire.AppendTag(u, 3, protowire.VarintType), 1)
	msg := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "q")
	msg = protowire.AppendBytes(protowire.AppendTag(msg, 2, protowire.BytesType), u)
	if err := st.SendMsg(&msg); err != nil {
		t.Fatal(err)
	}
	var resp []byte
	if err := st.RecvMsg(&resp); err != nil {
		t.Fatalf("no response: %v", err)
	}
	if !bytes.Contains(resp, id) {
		t.Fatalf("the response does not echo the bucket id byte-exact: %q", resp)
	}
	// A token bucket (tokens_per_fill's wrapper), not a blanket rule.
	if h.svc.Buckets() != 1 || !bytes.Contains(resp, []byte{0x12}) {
		t.Fatalf("response %q, %d buckets", resp, h.svc.Buckets())
	}
	var rr rlqsv3.RateLimitQuotaResponse
	if err := proto.Unmarshal(resp, &rr); err == nil {
		t.Fatal("protobuf-go reads the response: the id was not echoed as sent")
	}
	// The bucket's metric label (detailed_metric puts the value in) is
	// valid text.
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if strings.Contains(l.GetValue(), `\xffbob`) {
					found = true
				}
			}
		}
	}
	if !found {
		t.Fatal("no bucket series with the escaped value")
	}
}
