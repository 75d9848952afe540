package rls

import (
	"strconv"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/rlheaders"
)

// rateLimitHeaders describes the most restrictive status with a limit: an
// OVER_LIMIT one (the longest wait) if any, else the one with the least
// remaining. It returns nil when no status has a limit. names are the
// fields' names (all set).
func rateLimitHeaders(sts []*rlsv3.RateLimitResponse_DescriptorStatus, names rlheaders.LegacyNames) []*corev3.HeaderValue {
	var best *rlsv3.RateLimitResponse_DescriptorStatus
	for _, st := range sts {
		if st.CurrentLimit == nil {
			continue
		}
		switch {
		case best == nil:
			best = st
		case (st.Code == rlsv3.RateLimitResponse_OVER_LIMIT) != (best.Code == rlsv3.RateLimitResponse_OVER_LIMIT):
			if st.Code == rlsv3.RateLimitResponse_OVER_LIMIT {
				best = st
			}
		case st.Code == rlsv3.RateLimitResponse_OVER_LIMIT:
			if st.DurationUntilReset.AsDuration() > best.DurationUntilReset.AsDuration() {
				best = st
			}
		case st.LimitRemaining < best.LimitRemaining:
			best = st
		}
	}
	if best == nil {
		return nil
	}
	reset := (best.DurationUntilReset.AsDuration() + time.Second - 1) / time.Second
	return []*corev3.HeaderValue{
		{Key: names.Limit, Value: strconv.FormatUint(uint64(best.CurrentLimit.RequestsPerUnit), 10)},
		{Key: names.Remaining, Value: strconv.FormatUint(uint64(best.LimitRemaining), 10)},
		{Key: names.Reset, Value: strconv.FormatInt(int64(reset), 10)},
	}
}

// moreRestrictive reports whether decision a (denied when aDenied) binds
// harder than b: any denial beats an allowance, a longer wait beats a shorter
// one among denials, and less remaining beats more among allowances.
func moreRestrictive(a *algorithms.Decision, aDenied bool, b *algorithms.Decision, bDenied bool) bool {
	if aDenied != bDenied {
		return aDenied
	}
	if aDenied {
		return a.RetryAfter > b.RetryAfter
	}
	if a.Remaining != b.Remaining {
		return a.Remaining < b.Remaining
	}
	return a.ResetAfter > b.ResetAfter
}
