package rls

import (
	"context"
	"testing"
	"time"
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
			bctx, cancel := s.budget(ctx)
			after := time.Now()
			defer cancel()
			d, ok := bctx.Deadline()
			if !ok {
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
	if _, ok := func() (time.Time, bool) {
		c, cancel := s.budget(context.Background())
		defer cancel()
		return c.Deadline()
	}(); ok {
		t.Error("a deadline with neither a caller deadline nor a backend timeout")
	}
}
