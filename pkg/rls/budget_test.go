package rls

import (
	"context"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/backend"
	"github.com/envoyrls/envoy-rls/pkg/backend/memory"
	"github.com/envoyrls/envoy-rls/pkg/descriptors"
)

func TestAnswerMargin(t *testing.T) {
	for _, tc := range []struct{ remaining, want time.Duration }{
		{0, MinAnswerMargin},
		{5 * time.Millisecond, MinAnswerMargin},
		{20 * time.Millisecond, 2 * time.Millisecond},
		{2 * time.Second, MaxAnswerMargin},
	} {
		if got := AnswerMargin(tc.remaining); got != tc.want {
			t.Errorf("AnswerMargin(%v) = %v, want %v", tc.remaining, got, tc.want)
		}
	}
}

// TestBudget: the caller's deadline minus the margin, capped by the backend
// timeout, which applies alone when the caller sends no deadline. The
// deadlines are compared with the instants read around the call, so no
// wall-clock slack is needed.
func TestBudget(t *testing.T) {
	for _, tc := range []struct {
		name           string
		callerDeadline time.Duration                                     // 0: none
		backendTimeout time.Duration                                     // 0: none
		want           func(caller time.Duration) (lo, hi time.Duration) // offsets from before and after the call
	}{
		{"caller only", 2 * time.Second, 0, func(c time.Duration) (time.Duration, time.Duration) {
			return c - MaxAnswerMargin, c - MaxAnswerMargin
		}},
		{"caller earlier than the cap", 20 * time.Millisecond, time.Second, func(c time.Duration) (time.Duration, time.Duration) {
			return c - 2*time.Millisecond, c - 2*time.Millisecond
		}},
		{"cap earlier than the caller", 2 * time.Second, 100 * time.Millisecond, func(time.Duration) (time.Duration, time.Duration) {
			return 100 * time.Millisecond, 100 * time.Millisecond
		}},
		{"cap only", 0, 100 * time.Millisecond, func(time.Duration) (time.Duration, time.Duration) {
			return 100 * time.Millisecond, 100 * time.Millisecond
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := New(nil, nil, Options{BackendTimeout: tc.backendTimeout})
			ctx := context.Background()
			before := time.Now()
			if tc.callerDeadline > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithDeadline(ctx, before.Add(tc.callerDeadline))
				defer cancel()
			}
			d := s.budget(ctx, time.Now())
			after := time.Now()
			if d.IsZero() {
				t.Fatal("no deadline")
			}
			lo, hi := tc.want(tc.callerDeadline)
			// The margin is a tenth of what remained at the call, which is
			// between caller-(after-before) and caller: allow that spread.
			spread := after.Sub(before)
			if d.Before(before.Add(lo-spread)) || d.After(after.Add(hi+spread)) {
				t.Errorf("deadline %v after the start, want %v..%v (±%v)", d.Sub(before), lo, hi, spread)
			}
		})
	}
	s := New(nil, nil, Options{})
	if d := s.budget(context.Background(), time.Now()); !d.IsZero() {
		t.Error("a deadline with neither a caller deadline nor a backend timeout")
	}
}

// deadlineStore decides with a real memory store and records the deadline
// of the context each call gets. It does not embed the memory store, whose
// ApplyBy it would take: the service treats it as any store that takes no
// deadline of its own.
type deadlineStore struct {
	m        *memory.Store
	deadline time.Time
	has      bool
	until    time.Time // ApplyBy's deadline
}

func (d *deadlineStore) Apply(ctx context.Context, items []backend.Item, out []algorithms.Decision) (bool, error) {
	d.deadline, d.has = ctx.Deadline()
	return d.m.Apply(ctx, items, out)
}

func (d *deadlineStore) Close() error { return d.m.Close() }

// byDeadlineStore is a deadlineStore that takes the budget as a deadline
// (backend.TakesDeadline), as the memory and Redis stores do.
type byDeadlineStore struct{ *deadlineStore }

func (d byDeadlineStore) ApplyBy(ctx context.Context, until time.Time, items []backend.Item, out []algorithms.Decision) (bool, error) {
	d.until = until
	return d.Apply(ctx, items, out)
}

// TestStoreThatTakesADeadlineRunsUnderTheCallersContext: a store that takes
// no deadline gets the call's budget (the caller's deadline less the answer
// margin) as its context's deadline; a store that takes it beside its
// context (backend.TakesDeadline, which the memory store, which never
// waits, does by ignoring it) gets the caller's context as it is, with no
// context (and timer) made per call, and the budget as the deadline.
func TestStoreThatTakesADeadlineRunsUnderTheCallersContext(t *testing.T) {
	var _ backend.TakesDeadline = (*memory.Store)(nil)
	cfg, err := descriptors.Parse("t.yaml", []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 10}\n"))
	if err != nil {
		t.Fatal(err)
	}
	req := &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*commonv3.RateLimitDescriptor{{
		Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}},
	}}}
	caller := time.Now().Add(time.Minute)
	ctx, cancel := context.WithDeadline(context.Background(), caller)
	defer cancel()
	for _, tc := range []struct {
		name  string
		never bool
		want  time.Time
	}{
		{"context deadline", false, caller.Add(-MaxAnswerMargin)},
		{"takes a deadline", true, caller},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := memory.New()
			defer m.Close()
			rec := &deadlineStore{m: m}
			var store backend.Store = rec
			if tc.never {
				store = byDeadlineStore{rec}
			}
			s := New(store, cfg, Options{})
			resp, err := s.ShouldRateLimit(ctx, req)
			if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
				t.Fatalf("ShouldRateLimit: %v, %v", resp, err)
			}
			if !rec.has || !rec.deadline.Equal(tc.want) {
				t.Errorf("the store's deadline: %v (set: %v), want %v", rec.deadline, rec.has, tc.want)
			}
			if budget := caller.Add(-MaxAnswerMargin); tc.never && !rec.until.Equal(budget) {
				t.Errorf("ApplyBy's deadline: %v, want the budget %v", rec.until, budget)
			}
		})
	}
}
