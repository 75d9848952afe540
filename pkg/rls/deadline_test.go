package rls_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/envoyrls/envoy-rls/internal/redistest"
	"github.com/envoyrls/envoy-rls/internal/schedprobe"
	"github.com/envoyrls/envoy-rls/internal/testutil"
	"github.com/envoyrls/envoy-rls/pkg/backend/redis"
	"github.com/envoyrls/envoy-rls/pkg/descriptors"
	"github.com/envoyrls/envoy-rls/pkg/rls"
)

// TestHungBackendIsBoundedByTheEarlierDeadline freezes a real redis-server
// (SIGSTOP: connections stay open, nothing answers) and checks that a call
// returns by the earlier of the caller's deadline (less the answer margin)
// and the backend timeout, answering by the failure mode. The slack allowed
// is the scheduling delay measured meanwhile, not a fixed figure.
func TestHungBackendIsBoundedByTheEarlierDeadline(t *testing.T) {
	srv := redistest.StartStandalone(t)
	cfg, err := descriptors.Parse("t.yaml", []byte(basicYAML))
	if err != nil {
		t.Fatal(err)
	}
	// The stall check off: this is the bound when nothing notices the
	// hang (with it, the store answers by the failure mode at once once
	// the freeze is noticed: pkg/backend/redis's TestStallFrozen).
	store, err := redis.New(redis.Options{URL: srv.URL(), ReadTimeout: time.Minute, WriteTimeout: time.Minute, StallTimeout: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	req := &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*commonv3.RateLimitDescriptor{desc("user", "hung")}}

	// Warm the connection while Redis answers.
	warm := rls.New(store, cfg, rls.Options{BackendTimeout: time.Second})
	if r, err := warm.ShouldRateLimit(context.Background(), req); err != nil || r.Statuses[0].CurrentLimit == nil {
		t.Fatalf("warm-up: %v %v", r, err)
	}
	srv.Pause()

	for _, tc := range []struct {
		name           string
		backendTimeout time.Duration
		callerDeadline time.Duration
		mode           rls.FailureMode
		cause          string // in the log line
	}{
		{"backend timeout first, fail open", 50 * time.Millisecond, 5 * time.Second, rls.FailOpen, `cause="timed out after 50ms (--backend-timeout)"`},
		{"backend timeout first, fail closed", 50 * time.Millisecond, 5 * time.Second, rls.FailClosed, `cause="timed out after 50ms (--backend-timeout)"`},
		{"caller deadline first", 5 * time.Second, 80 * time.Millisecond, rls.FailOpen, `cause="the caller's deadline came first (Envoy's timeout, less a margin to answer)"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs testutil.SyncBuffer
			svc := rls.New(store, cfg, rls.Options{BackendTimeout: tc.backendTimeout, FailureMode: tc.mode, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			ctx, cancel := context.WithTimeout(context.Background(), tc.callerDeadline)
			defer cancel()
			probe := schedprobe.Start()
			start := time.Now()
			resp, err := svc.ShouldRateLimit(ctx, req)
			took := time.Since(start)
			slack := probe.Stop()
			bound := min(tc.backendTimeout, tc.callerDeadline-rls.AnswerMargin(tc.callerDeadline))
			if took < bound-slack || took > bound+slack {
				t.Errorf("call took %v, want %v within the measured scheduling slack %v", took, bound, slack)
			}
			if !strings.Contains(logs.String(), tc.cause) {
				t.Errorf("log does not name the cause %s:\n%s", tc.cause, logs.String())
			}
			switch tc.mode {
			case rls.FailOpen:
				if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
					t.Errorf("fail open: %v %v", resp, err)
				}
			case rls.FailClosed:
				if status.Code(err) != codes.Unavailable {
					t.Errorf("fail closed: %v %v", resp, err)
				}
			}
		})
	}
	srv.Resume()
	// Real decisions again (a fail-open answer has no reset time). The
	// scripts sent before the freeze may still run when Redis resumes: a
	// call that gave up cannot unsend them, so the count is not asserted.
	waitOK := time.Now().Add(10 * time.Second)
	for {
		r, err := warm.ShouldRateLimit(context.Background(), req)
		if err == nil && r.Statuses[0].DurationUntilReset != nil {
			break
		}
		if time.Now().After(waitOK) {
			t.Fatalf("after Resume: %v %v", r, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
