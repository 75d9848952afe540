package rls_test

import (
	"log/slog"
	"strings"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/envoyrls/envoy-rls/internal/testutil"
	"github.com/envoyrls/envoy-rls/pkg/rls"
)

// TestUnknownDomainAndUnmatchedAreCountedAndLogged: requests for a domain
// the config lacks, and descriptors that match no rule, are allowed, counted
// and logged at debug level (the first of each in a second).
func TestUnknownDomainAndUnmatchedAreCountedAndLogged(t *testing.T) {
	reg := prometheus.NewRegistry()
	var logs testutil.SyncBuffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	h := start(t, basicYAML, rls.Options{Metrics: rls.NewMetrics(reg), Logger: log})
	for i := 0; i < 3; i++ {
		if r := h.call(t, "dd", desc("user", "a")); r.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("unknown domain: %v", r)
		}
	}
	// One unmatched descriptor beside a matched one and an override.
	override := desc("nothing", "here")
	override.Limit = &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: typev3.RateLimitUnit_MINUTE}
	r := h.call(t, "d", desc("user", "a"), desc("nothing", "here"), override)
	if r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[1].CurrentLimit != nil {
		t.Fatalf("unmatched descriptor: %v", r)
	}
	if got := testutil.Gather(t, reg).ByLabelValues("envoy_rls_unknown_domain_requests_total"); got[""] != 3 {
		t.Errorf("envoy_rls_unknown_domain_requests_total %v, want 3", got)
	}
	if got := testutil.Gather(t, reg).ByLabelValues("envoy_rls_unmatched_descriptors_total"); len(got) != 1 || got["d"] != 1 {
		t.Errorf("envoy_rls_unmatched_descriptors_total %v, want {d: 1}", got)
	}
	l := logs.String()
	if n := strings.Count(l, `msg="unknown domain: allowed without limits" domain=dd`); n != 1 {
		t.Errorf("%d unknown-domain lines in a second, want 1:\n%s", n, l)
	}
	if n := strings.Count(l, `msg="descriptor matches no rule: allowed without limit" domain=d descriptor="nothing=here"`); n != 1 {
		t.Errorf("%d unmatched lines, want 1:\n%s", n, l)
	}
	// The domain is bounded in the log line.
	var logs2 testutil.SyncBuffer
	h2 := start(t, basicYAML, rls.Options{Logger: slog.New(slog.NewTextHandler(&logs2, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	h2.call(t, strings.Repeat("z", rls.MaxFieldBytes), desc("user", "a"))
	if l := logs2.String(); !strings.Contains(l, "domain="+strings.Repeat("z", 128)+"…") || strings.Contains(l, strings.Repeat("z", 129)) {
		t.Errorf("a 4 KiB domain is not cut at 128 bytes in the log:\n%.300s", l)
	}
}
