// Package rlqstest is an RLQS client that behaves as Envoy's
// rate_limit_quota filter does today (see docs/rlqs.md and the notes it
// cites from Envoy's source), for tests of the RLQS service:
//
//   - one stream per client (Envoy: per target and domain), opened at the
//     first bucket; reopened at the next report after it closes, with no
//     backoff; a report that cannot be sent is lost;
//   - a new bucket's first request is decided by the no-assignment
//     behavior (ALLOW_ALL unless a DENY_ALL blanket rule is set) and
//     reported at once, alone, with time_elapsed 0; the counts it reports
//     are zeroed even when the stream is down;
//   - every report period, one report of every bucket, idle ones too,
//     with time_elapsed in whole seconds;
//   - actions matched to buckets by their id (map order does not matter);
//     unknown buckets and empty ids skipped; requests_per_time_unit and
//     unset strategies skipped without touching the bucket; an action with
//     neither assignment nor abandon kept with TTL 0;
//   - a token bucket refills continuously at tokens_per_fill over the fill
//     interval truncated to whole seconds (0 s: unlimited; a 0 rate: one
//     token a year), holds at most max_tokens, starts full when no token
//     bucket was in force, and otherwise at the old one's fill ratio; it is
//     kept when max_tokens, tokens_per_fill and fill_interval.nanos are
//     unchanged (only those are compared);
//   - an assignment expires after its TTL's whole seconds, to the
//     expired-assignment fallback for its timeout's whole seconds (a token
//     bucket fallback replaced or carried over by the same rule), then to
//     the no-assignment behavior; the bucket stays and keeps being
//     reported;
//   - abandon erases the bucket: its next request creates it again.
package rlqstest

import (
	"context"
	"math"
	"slices"
	"strconv"
	"sync"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Options configure a Client.
type Options struct {
	// Conn is the connection to the RLQS server.
	Conn *grpc.ClientConn
	// Domain is sent on every report, as Envoy does.
	Domain string
	// Period is the report period (Envoy: 5 s).
	Period time.Duration
	// DenyNoAssignment makes the no-assignment behavior a DENY_ALL
	// blanket rule (Envoy's default, unset, allows).
	DenyNoAssignment bool
	// Fallback, when set, is the expired-assignment fallback strategy
	// (blanket or token bucket) for FallbackTimeout (whole seconds).
	Fallback        *typev3.RateLimitStrategy
	FallbackTimeout time.Duration
	// Now reads the clock (nil: time.Now).
	Now func() time.Time
}

// Client is one Envoy's RLQS client. Its methods are safe for concurrent
// use.
type Client struct {
	o      Options
	mu     sync.Mutex
	b      map[string]*bucket
	stream grpc.BidiStreamingClient[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse]
	cancel context.CancelFunc // of the stream
	timer  bool               // the report loop runs
	stop   chan struct{}
	done   chan struct{}
	closed bool

	// Stats, for tests.
	Responses, StreamsOpened, ReportsLost int
}

// Bucket state: what decides a request.
type bucket struct {
	id      map[string]string
	allowed uint64 // since the last report
	denied  uint64
	last    time.Time // last report of the bucket

	action   *rlqsv3.RateLimitQuotaResponse_BucketAction // nil: the no-assignment default
	limiter  *tokenBucket
	expires  time.Time // of action (zero: none)
	fallback bool      // action is the expired fallback
	fbEnds   time.Time

	// Totals, for tests.
	Allowed, Denied uint64
	Actions         []*rlqsv3.RateLimitQuotaResponse_BucketAction
}

// New returns a client; it opens its stream at the first request.
func New(o Options) *Client {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Period <= 0 {
		o.Period = 5 * time.Second
	}
	return &Client{o: o, b: map[string]*bucket{}, stop: make(chan struct{}), done: make(chan struct{})}
}

// Key returns the client's name of a bucket id (its entries in key order).
func Key(id map[string]string) string {
	keys := make([]string, 0, len(id))
	for k := range id {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b []byte
	for _, k := range keys {
		b = strconv.AppendQuote(b, k)
		b = append(b, '=')
		b = strconv.AppendQuote(b, id[k])
		b = append(b, ' ')
	}
	return string(b)
}

// Request decides one request of bucket id, as the filter does.
func (c *Client) Request(id map[string]string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false
	}
	now := c.o.Now()
	k := Key(id)
	b := c.b[k]
	if b == nil {
		allow := !c.o.DenyNoAssignment
		b = &bucket{id: maps(id), last: now}
		c.b[k] = b
		c.count(b, allow)
		if !c.timer {
			c.timer = true
			go c.reportLoop()
		}
		c.startStream()
		// The initial report: this bucket alone, time_elapsed 0; its
		// counts are zeroed whether or not it can be sent.
		rep := c.usage(b, now)
		c.send(&rlqsv3.RateLimitQuotaUsageReports{Domain: c.o.Domain, BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{rep}})
		return allow
	}
	c.advance(b, now)
	allow := c.decide(b, now)
	c.count(b, allow)
	return allow
}

func (c *Client) count(b *bucket, allow bool) {
	if allow {
		b.allowed++
		b.Allowed++
	} else {
		b.denied++
		b.Denied++
	}
}

// decide applies the bucket's action (or its default) to one request.
func (c *Client) decide(b *bucket, now time.Time) bool {
	if b.action == nil {
		return !c.o.DenyNoAssignment
	}
	qa := b.action.GetQuotaAssignmentAction()
	if qa == nil {
		return true // no strategy: fails open
	}
	switch s := qa.GetRateLimitStrategy().GetStrategy().(type) {
	case *typev3.RateLimitStrategy_BlanketRule_:
		return s.BlanketRule != typev3.RateLimitStrategy_DENY_ALL
	case *typev3.RateLimitStrategy_TokenBucket:
		return b.limiter.consume(now)
	}
	return true
}

// advance applies the expiries due at now, at the times they were due.
func (c *Client) advance(b *bucket, now time.Time) {
	for {
		switch {
		case b.action != nil && !b.fallback && !b.expires.IsZero() && !now.Before(b.expires):
			at := b.expires
			b.expires = time.Time{}
			if c.o.Fallback == nil {
				b.action, b.limiter = nil, nil
				continue
			}
			fb := &rlqsv3.RateLimitQuotaResponse_BucketAction{BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{
				QuotaAssignmentAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{RateLimitStrategy: c.o.Fallback}}}
			var lim *tokenBucket
			if tb := c.o.Fallback.GetTokenBucket(); tb != nil {
				if replace(b.action, tb) {
					lim = newTokenBucket(tb, b.limiter, at)
				} else {
					lim = b.limiter
				}
			}
			b.action, b.limiter, b.fallback = fb, lim, true
			b.fbEnds = at.Add(time.Duration(c.o.FallbackTimeout/time.Second) * time.Second)
		case b.fallback && !now.Before(b.fbEnds):
			b.action, b.limiter, b.fallback = nil, nil, false
		default:
			return
		}
	}
}

// replace reports whether a token bucket tb replaces the bucket's limiter
// (Envoy's shouldReplaceTokenBucket): when the action in force has no
// token bucket, or one that differs in max_tokens, tokens_per_fill or
// fill_interval.nanos.
func replace(cur *rlqsv3.RateLimitQuotaResponse_BucketAction, tb *typev3.TokenBucket) bool {
	old := cur.GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket()
	if old == nil {
		return true
	}
	return old.GetMaxTokens() != tb.GetMaxTokens() || old.GetTokensPerFill().GetValue() != tb.GetTokensPerFill().GetValue() ||
		old.GetFillInterval().GetNanos() != tb.GetFillInterval().GetNanos()
}

// usage builds a bucket's usage and zeroes its counts.
func (c *Client) usage(b *bucket, now time.Time) *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage {
	u := &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
		BucketId:           &rlqsv3.BucketId{Bucket: maps(b.id)},
		TimeElapsed:        &durationpb.Duration{Seconds: int64(now.Sub(b.last) / time.Second)},
		NumRequestsAllowed: b.allowed,
		NumRequestsDenied:  b.denied,
	}
	b.allowed, b.denied, b.last = 0, 0, now
	return u
}

// startStream opens the stream if it is not open (c.mu held).
func (c *Client) startStream() bool {
	if c.stream != nil {
		return true
	}
	ctx, cancel := context.WithCancel(context.Background())
	st, err := rlqsv3.NewRateLimitQuotaServiceClient(c.o.Conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		cancel()
		return false
	}
	c.stream, c.cancel = st, cancel
	c.StreamsOpened++
	go c.receive(st)
	return true
}

// send sends a report, or loses it when the stream is down (c.mu held).
func (c *Client) send(r *rlqsv3.RateLimitQuotaUsageReports) {
	if c.stream == nil {
		c.ReportsLost++
		return
	}
	if err := c.stream.Send(r); err != nil {
		c.ReportsLost++
	}
}

// reportLoop sends every bucket's usage every period.
func (c *Client) reportLoop() {
	defer close(c.done)
	t := time.NewTicker(c.o.Period)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
		}
		c.Report()
	}
}

// Report sends one periodic report now (the report loop calls it every
// period).
func (c *Client) Report() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	now := c.o.Now()
	r := &rlqsv3.RateLimitQuotaUsageReports{Domain: c.o.Domain}
	keys := make([]string, 0, len(c.b))
	for k := range c.b {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		r.BucketQuotaUsages = append(r.BucketQuotaUsages, c.usage(c.b[k], now))
	}
	if c.stream == nil && !c.startStream() {
		c.ReportsLost++ // the usage is lost
		return
	}
	c.send(r)
}

// receive applies the responses of one stream until it closes.
func (c *Client) receive(st grpc.BidiStreamingClient[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse]) {
	for {
		resp, err := st.Recv()
		if err != nil {
			c.mu.Lock()
			if c.stream == st {
				c.stream = nil
				c.cancel()
			}
			c.mu.Unlock()
			return
		}
		c.apply(resp)
	}
}

// apply applies a response's actions, in order.
func (c *Client) apply(resp *rlqsv3.RateLimitQuotaResponse) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.Responses++
	now := c.o.Now()
	for _, a := range resp.GetBucketAction() {
		if len(a.GetBucketId().GetBucket()) == 0 {
			continue
		}
		k := Key(a.GetBucketId().GetBucket())
		b := c.b[k]
		if b == nil {
			continue // not a bucket of ours
		}
		c.advance(b, now)
		b.Actions = append(b.Actions, proto.Clone(a).(*rlqsv3.RateLimitQuotaResponse_BucketAction))
		var lim *tokenBucket
		if qa := a.GetQuotaAssignmentAction(); qa != nil {
			switch s := qa.GetRateLimitStrategy().GetStrategy().(type) {
			case *typev3.RateLimitStrategy_BlanketRule_:
			case *typev3.RateLimitStrategy_TokenBucket:
				if b.action != nil && !replace(b.action, s.TokenBucket) {
					lim = b.limiter
				} else {
					lim = newTokenBucket(s.TokenBucket, b.limiter, now)
				}
			default: // requests_per_time_unit, or unset: skipped
				continue
			}
		} else if a.GetAbandonAction() != nil {
			delete(c.b, k)
			continue
		}
		b.action, b.limiter, b.fallback = a, lim, false
		b.expires = now.Add(time.Duration(a.GetQuotaAssignmentAction().GetAssignmentTimeToLive().GetSeconds()) * time.Second)
	}
}

// Snapshot is a bucket's state, for tests.
type Snapshot struct {
	Allowed, Denied uint64 // since the bucket was created
	Assigned        bool   // an assignment (not the default or fallback) is in force
	Fallback        bool
	Blanket         *typev3.RateLimitStrategy_BlanketRule
	Rate            float64 // the token bucket's refill rate, requests per second
	Burst           uint32
	Actions         int // actions received
	Exists          bool
}

// Bucket returns a snapshot of the bucket id.
func (c *Client) Bucket(id map[string]string) Snapshot {
	c.mu.Lock()
	defer c.mu.Unlock()
	b := c.b[Key(id)]
	if b == nil {
		return Snapshot{}
	}
	c.advance(b, c.o.Now())
	s := Snapshot{Exists: true, Allowed: b.Allowed, Denied: b.Denied, Actions: len(b.Actions), Fallback: b.fallback}
	s.Assigned = b.action != nil && !b.fallback
	if b.action != nil {
		st := b.action.GetQuotaAssignmentAction().GetRateLimitStrategy()
		if _, ok := st.GetStrategy().(*typev3.RateLimitStrategy_BlanketRule_); ok {
			r := st.GetBlanketRule()
			s.Blanket = &r
		}
		if tb := st.GetTokenBucket(); tb != nil && b.limiter != nil {
			s.Rate, s.Burst = b.limiter.rate, tb.GetMaxTokens()
		}
	}
	return s
}

// Buckets returns the number of buckets the client holds.
func (c *Client) Buckets() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.b)
}

// Drop closes the stream (as a server-side close would); the next report
// reopens it.
func (c *Client) Drop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stream != nil {
		c.cancel()
		c.stream = nil
	}
}

// Close stops the client: no more reports or requests; its stream ends.
func (c *Client) Close() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	timer := c.timer
	close(c.stop)
	if c.stream != nil {
		c.cancel()
		c.stream = nil
	}
	c.mu.Unlock()
	if timer {
		<-c.done
	}
}

func maps(m map[string]string) map[string]string {
	c := make(map[string]string, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

// tokenBucket is Envoy's token bucket as the RLQS filter builds it.
type tokenBucket struct {
	max    float64
	rate   float64 // tokens per second
	tokens float64
	at     time.Time
}

// minFillRate is Envoy's floor on a fill rate: one token a year.
const minFillRate = 1.0 / (365 * 24 * 60 * 60)

// newTokenBucket builds tb as Envoy does at t: the fill interval truncated
// to whole seconds, full when there is no old bucket, else at the old
// bucket's fill ratio.
func newTokenBucket(tb *typev3.TokenBucket, old *tokenBucket, t time.Time) *tokenBucket {
	secs := tb.GetFillInterval().AsDuration() / time.Second
	rate := math.Inf(1)
	if secs > 0 {
		rate = float64(tb.GetTokensPerFill().GetValue()) / float64(secs)
	}
	rate = max(rate, minFillRate)
	n := &tokenBucket{max: float64(tb.GetMaxTokens()), rate: rate, at: t}
	n.tokens = n.max
	if old != nil {
		old.refill(t)
		ratio := 0.0
		if old.max > 0 {
			ratio = old.tokens / old.max
		}
		n.tokens = math.Floor(n.max * ratio)
	}
	return n
}

func (b *tokenBucket) refill(t time.Time) {
	if t.After(b.at) {
		b.tokens = min(b.max, b.tokens+b.rate*t.Sub(b.at).Seconds())
		b.at = t
	}
}

func (b *tokenBucket) consume(t time.Time) bool {
	b.refill(t)
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// ResponseCount returns the number of responses received.
func (c *Client) ResponseCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.Responses
}

// Connected reports whether the stream is open.
func (c *Client) Connected() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stream != nil
}

// Actions returns the actions received for bucket id.
func (c *Client) Actions(id map[string]string) []*rlqsv3.RateLimitQuotaResponse_BucketAction {
	c.mu.Lock()
	defer c.mu.Unlock()
	if b := c.b[Key(id)]; b != nil {
		return slices.Clone(b.Actions)
	}
	return nil
}
