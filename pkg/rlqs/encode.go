package rlqs

import (
	"math"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// The assignments, as Envoy's RLQS client needs them (see docs/rlqs.md):
// only blanket_rule and token_bucket (requests_per_time_unit is skipped by
// Envoy); tokens_per_fill always set (Envoy reads an unset one as 0, a
// bucket that never refills); fill_interval in whole seconds, at least one
// (Envoy truncates it to whole seconds, so 1.5 s would be 1 s and a
// sub-second interval an unlimited bucket); TTL in whole seconds (Envoy
// reads only its seconds) and longer than a report period, re-sent with
// every report to extend it. Envoy keeps its token bucket when max_tokens,
// tokens_per_fill and fill_interval.nanos are unchanged, and compares
// nothing else: a change of fill_interval.seconds alone would be ignored,
// so the encoder never sends one (see tokenBucket).

// DefaultReportPeriod is Envoy's report period (hard-coded in Envoy
// today): the period a stream is assumed to have until it has shown its
// own.
const DefaultReportPeriod = 5 * time.Second

// ttlPeriods is the assignment TTL in report periods: an assignment
// outlives one lost report and a reconnect (Envoy reconnects at its next
// report, up to a period later, and resends everything then).
const ttlPeriods = 3

// ttlFor returns the TTL of an assignment for a stream reporting every
// period: ttlPeriods periods, rounded up to whole seconds, at least 1 s.
func ttlFor(period time.Duration) time.Duration {
	if period <= 0 {
		period = DefaultReportPeriod
	}
	secs := math.Ceil((ttlPeriods * period).Seconds())
	return time.Duration(max(secs, 1)) * time.Second
}

// sent is what was last sent for a bucket on a stream, to encode the next
// assignment so that Envoy applies it.
type sent struct {
	tb                  bool  // a token bucket (else a blanket rule, or nothing)
	fill, tokens, burst int64 // the token bucket's fill interval (s), tokens_per_fill, max_tokens
}

// tokenBucket returns the token bucket of tokens per fill seconds with a
// burst of burst tokens, as it must be sent after prev: when only the fill
// interval would change, Envoy would keep the old bucket (and its old
// rate), so tokens_per_fill goes one lower, else max_tokens one lower,
// else (both 1) max_tokens one higher, to make the change visible.
func tokenBucket(prev sent, fill, tokens, burst int64) sent {
	s := sent{tb: true, fill: fill, tokens: min(max(tokens, 1), math.MaxUint32), burst: min(max(burst, 1), math.MaxUint32)}
	if prev.tb && prev.fill != s.fill && prev.tokens == s.tokens && prev.burst == s.burst {
		switch {
		case s.tokens > 1:
			s.tokens--
		case s.burst > 1:
			s.burst--
		default:
			s.burst++
		}
	}
	return s
}

// closed is the assignment of a share of zero: one token that practically
// never refills (one per maxFillInterval, about three years; Envoy's floor
// on a rate is one a year). Not DENY_ALL: after a blanket rule Envoy starts
// its next token bucket full, so a share that drops to zero and comes back
// would be handed a whole burst each time; from this bucket the next one
// starts at its fill ratio (empty, or full at one token).
var closed = sent{tb: true, fill: maxFillInterval, tokens: 1, burst: 1}

// assignment returns the action assigning s to the bucket id for ttl.
func assignment(id *rlqsv3.BucketId, s sent, ttl time.Duration) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	strategy := &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
		MaxTokens:     uint32(s.burst),
		TokensPerFill: wrapperspb.UInt32(uint32(s.tokens)),
		FillInterval:  &durationpb.Duration{Seconds: s.fill},
	}}}
	return action(id, strategy, ttl)
}

// blanket returns the action assigning a blanket rule for ttl.
func blanket(id *rlqsv3.BucketId, deny bool, ttl time.Duration) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	rule := typev3.RateLimitStrategy_ALLOW_ALL
	if deny {
		rule = typev3.RateLimitStrategy_DENY_ALL
	}
	return action(id, &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: rule}}, ttl)
}

func action(id *rlqsv3.BucketId, strategy *typev3.RateLimitStrategy, ttl time.Duration) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	return &rlqsv3.RateLimitQuotaResponse_BucketAction{
		BucketId: id,
		BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{
			QuotaAssignmentAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
				AssignmentTimeToLive: &durationpb.Duration{Seconds: int64(ttl / time.Second)},
				RateLimitStrategy:    strategy,
			},
		},
	}
}

// abandon returns the action that makes Envoy forget the bucket.
func abandon(id *rlqsv3.BucketId) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	return &rlqsv3.RateLimitQuotaResponse_BucketAction{
		BucketId: id,
		BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction_{
			AbandonAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction{},
		},
	}
}
