// Package rlqs is envoy-rls's Rate Limit Quota Service: Envoy's
// rate_limit_quota filter reports, every few seconds on one stream per
// domain, how many requests each of its quota buckets saw, and enforces on
// its own the token bucket the service assigns it. The service matches each
// bucket to the descriptor configuration RLS uses (order-free: a BucketId
// is an unordered map), and divides the descriptor's limit among the
// Envoys that share the bucket: max-min fair shares of their demand, whose
// sum never exceeds the limit, on one instance or, through Redis, across
// all of them. docs/rlqs.md says what it promises and how to configure
// Envoy for it.
package rlqs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/envoyrls/envoy-rls/internal/textsafe"
	"github.com/envoyrls/envoy-rls/pkg/backend"
	"github.com/envoyrls/envoy-rls/pkg/descriptors"
)

// ServiceName is the gRPC service's full name (for health checks).
var ServiceName = rlqsv3.RateLimitQuotaService_ServiceDesc.ServiceName

// Defaults of the bounds (Options).
const (
	DefaultMaxStreams          = 1024
	DefaultMaxBucketsPerStream = 10_000
	DefaultMaxBuckets          = 100_000
	DefaultAbandonAfter        = 12
	DefaultHysteresis          = 1
	// MinReportSize is the least receive limit for reports: Envoy sends
	// every bucket of a stream in one message.
	MinReportSize = 4 << 20
)

// Bounds of one bucket id (its keys and values together); a larger one is
// answered with DENY_ALL and not kept.
const (
	MaxBucketEntries = 64
	MaxBucketIDBytes = 2 << 10
)

// Options configure a Service. Zero values take the defaults.
type Options struct {
	// Config returns the descriptor configuration in force (the one RLS
	// serves); it is read at every report, so a reload or an xDS update
	// applies at each bucket's next report.
	Config func() *descriptors.Config
	// Ledger is the store of the counters RLS decides on. Reported usage
	// (and, for rates, the assigned rates) is charged to the bucket's
	// counters, so RLS and RLQS traffic on one domain share one limit; a
	// budget (a window of a minute or more) is what its counter has left.
	// Nil keeps no ledger: budgets are then spread as plain rates.
	Ledger backend.Store
	// Shares hold every subscriber's share (NewRedisShares for several
	// instances); nil keeps them in the process.
	Shares Shares
	// DenyUnmatched answers buckets that match no descriptor (or a domain
	// the config does not have) with DENY_ALL instead of ALLOW_ALL.
	DenyUnmatched bool
	// MaxStreams bounds the streams open at once (more are refused with
	// RESOURCE_EXHAUSTED); MaxBucketsPerStream the buckets of one stream
	// and MaxBuckets those of all streams (a bucket past either is
	// abandoned).
	MaxStreams, MaxBucketsPerStream, MaxBuckets int
	// AbandonAfter is the number of reports in a row without a request
	// after which a bucket is abandoned (Envoy forgets it; it comes back
	// with its next request). Negative: never.
	AbandonAfter int
	// Hysteresis is the number of reports in a row that must ask for a
	// raise before a share is raised (lowerings apply at once). Negative:
	// none.
	Hysteresis int
	// IdleTimeout closes a stream that sends no report for that long (0:
	// 30 s), or for four of its report periods when that is longer.
	IdleTimeout time.Duration
	// LedgerInterval is how often the assigned rates are charged to the
	// Ledger (0: every second; negative: never, for tests that charge by
	// hand).
	LedgerInterval time.Duration
	// Now reads the clock (nil: time.Now).
	Now func() time.Time
	// Logger receives log lines (nil: slog.Default()).
	Logger *slog.Logger
	// Registerer, when set, gets the service's metrics.
	Registerer prometheus.Registerer
}

// Service is the RLQS gRPC service. Create it with New; Shutdown ends its
// streams and Close stops it.
type Service struct {
	rlqsv3.UnimplementedRateLimitQuotaServiceServer

	o        Options
	now      func() time.Time
	log      *slog.Logger
	shares   Shares
	instance string
	m        *metrics

	streams atomic.Int64 // open
	buckets atomic.Int64 // subscriptions of all streams
	seq     atomic.Uint64

	closing   chan struct{}
	closeOnce sync.Once
	stopOnce  sync.Once
	done      chan struct{} // the ledger loop ended

	aggMu sync.Mutex
	aggs  map[string]*bucketAgg // by policy key

	sharesLog, ledgerLog atomicTime // when each was last logged
}

// New returns a Service. It starts a goroutine that charges the assigned
// rates to the ledger every second; Close stops it.
func New(o Options) *Service {
	if o.Config == nil {
		o.Config = func() *descriptors.Config { return nil }
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.MaxStreams <= 0 {
		o.MaxStreams = DefaultMaxStreams
	}
	if o.MaxBucketsPerStream <= 0 {
		o.MaxBucketsPerStream = DefaultMaxBucketsPerStream
	}
	if o.MaxBuckets <= 0 {
		o.MaxBuckets = DefaultMaxBuckets
	}
	if o.AbandonAfter == 0 {
		o.AbandonAfter = DefaultAbandonAfter
	}
	if o.Hysteresis == 0 {
		o.Hysteresis = DefaultHysteresis
	}
	var id [6]byte
	_, _ = rand.Read(id[:])
	s := &Service{
		o: o, now: o.Now, log: o.Logger, shares: o.Shares,
		instance: hex.EncodeToString(id[:]),
		closing:  make(chan struct{}), done: make(chan struct{}),
		aggs: map[string]*bucketAgg{},
	}
	if s.shares == nil {
		s.shares = NewMemoryShares(o.Now)
	}
	s.m = newMetrics(s, o.Registerer)
	go s.ledgerLoop()
	return s
}

// Register registers the service on a gRPC server.
func (s *Service) Register(srv *grpc.Server) {
	rlqsv3.RegisterRateLimitQuotaServiceServer(srv, s)
}

// Shutdown ends every stream (UNAVAILABLE; Envoy reconnects, to another
// instance behind the same address, at its next report) without
// abandoning any bucket: the assignments Envoy holds run until their TTL.
// New streams are refused from then on. It returns at once; the streams'
// handlers return as soon as they see it.
func (s *Service) Shutdown() {
	s.closeOnce.Do(func() { close(s.closing) })
}

// Close shuts the service down and stops its ledger goroutine.
func (s *Service) Close() {
	s.Shutdown()
	s.stopOnce.Do(func() { <-s.done })
}

// Streams returns the number of open streams.
func (s *Service) Streams() int { return int(s.streams.Load()) }

// Buckets returns the number of buckets subscribed on all streams.
func (s *Service) Buckets() int { return int(s.buckets.Load()) }

func (s *Service) shuttingDown() bool {
	select {
	case <-s.closing:
		return true
	default:
		return false
	}
}

// received is a report and the time the server received it.
type received struct {
	m  *rlqsv3.RateLimitQuotaUsageReports
	at time.Time
}

// StreamRateLimitQuotas serves one Envoy's stream of one domain.
func (s *Service) StreamRateLimitQuotas(gs grpc.BidiStreamingServer[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse]) error {
	if s.shuttingDown() {
		s.m.refused("shutting_down")
		return status.Error(codes.Unavailable, "envoy-rls is shutting down")
	}
	if n := s.streams.Add(1); n > int64(s.o.MaxStreams) {
		s.streams.Add(-1)
		s.m.refused("max_streams")
		return status.Errorf(codes.ResourceExhausted, "too many RLQS streams: %d open (--rlqs-max-streams)", s.o.MaxStreams)
	}
	defer s.streams.Add(-1)
	ctx := gs.Context()
	st := s.newStream(ctx)
	defer st.close()

	msgs := make(chan received)
	errc := make(chan error, 1)
	go func() {
		for {
			m, err := gs.Recv()
			if err != nil {
				errc <- err
				return
			}
			select {
			case msgs <- received{m, s.now()}:
			case <-ctx.Done():
				return
			}
		}
	}()
	idle := time.NewTimer(st.idleTimeout())
	defer idle.Stop()
	for {
		select {
		case r := <-msgs:
			resp, err := st.handle(ctx, r.m, r.at)
			if err != nil {
				return err
			}
			if len(resp.GetBucketAction()) > 0 {
				if err := gs.Send(resp); err != nil {
					return err
				}
			}
			idle.Reset(st.idleTimeout())
		case err := <-errc:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case <-idle.C:
			s.m.closed("idle")
			return status.Errorf(codes.DeadlineExceeded, "no usage report for %s", st.idleTimeout())
		case <-s.closing:
			s.m.closed("shutdown")
			return status.Error(codes.Unavailable, "envoy-rls is shutting down: reconnect (the assignments hold until their TTL)")
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	}
}

// minIdleTimeout is the least time a stream may go without a report
// before it is closed (Envoy reports every period, empty or not).
const minIdleTimeout = 30 * time.Second

func (s *Service) newStream(ctx context.Context) *stream {
	st := &stream{
		svc:  s,
		id:   s.instance + "/" + strconv.FormatUint(s.seq.Add(1), 36),
		subs: map[uint64]*sub{},
	}
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		st.host = p.Addr.String()
		if h, _, err := net.SplitHostPort(st.host); err == nil {
			st.host = h
		}
	}
	s.m.streamOpened()
	return st
}

// logf logs at most once per stream per kind.
func (st *stream) warnOnce(kind string, msg string, args ...any) {
	if st.warned == nil {
		st.warned = map[string]bool{}
	}
	if st.warned[kind] {
		return
	}
	st.warned[kind] = true
	st.svc.log.Warn(msg, append([]any{"stream", st.id, "peer", st.host, "domain", textsafe.Escape(st.domain)}, args...)...)
}

// errDomain is returned when a stream changes its domain.
func errDomain(was, is string) error {
	return status.Errorf(codes.InvalidArgument, "RLQS report for domain %q on a stream of domain %q: one stream carries one domain", textsafe.Escape(is), textsafe.Escape(was))
}

// String names the stream in logs.
func (st *stream) String() string { return fmt.Sprintf("rlqs stream %s (%s)", st.id, st.host) }

// statusInvalid returns an InvalidArgument error.
func statusInvalid(msg string) error { return status.Error(codes.InvalidArgument, msg) }

// unmatchedName names the unmatched default in logs.
func (s *Service) unmatchedName() string {
	if s.o.DenyUnmatched {
		return "deny_all"
	}
	return "allow_all"
}

// atomicTime is a time safe for concurrent use (the zero value is the zero
// time).
type atomicTime struct{ ns atomic.Int64 }

func (a *atomicTime) Load() time.Time {
	if n := a.ns.Load(); n != 0 {
		return time.Unix(0, n)
	}
	return time.Time{}
}

func (a *atomicTime) Store(t time.Time) { a.ns.Store(t.UnixNano()) }
