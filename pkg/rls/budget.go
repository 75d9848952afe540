package rls

import (
	"context"
	"time"
)

// Answer margins: the part of a call's remaining time kept for answering
// after the store returns (building the response, writing it, and the
// scheduling delays in between). A tenth of what remains, at least
// MinAnswerMargin and at most MaxAnswerMargin.
const (
	MinAnswerMargin = time.Millisecond
	MaxAnswerMargin = 10 * time.Millisecond
)

// AnswerMargin returns the margin kept for answering out of remaining.
func AnswerMargin(remaining time.Duration) time.Duration {
	return min(max(remaining/10, MinAnswerMargin), MaxAnswerMargin)
}

// budget returns the deadline of a store call made at now (zero: none): the
// caller's deadline minus the answer margin, and no later than
// BackendTimeout from now; with no caller deadline, BackendTimeout alone. A busy service
// therefore waits for the backend as long as the caller can wait, rather
// than for a fixed time after which it would answer by the failure mode.
// The store takes it beside the caller's context (backend.TakesDeadline).
func (s *Service) budget(ctx context.Context, now time.Time) time.Time {
	var until time.Time
	if d, ok := ctx.Deadline(); ok {
		until = d.Add(-AnswerMargin(d.Sub(now)))
	}
	if t := s.opts.BackendTimeout; t > 0 {
		if c := now.Add(t); until.IsZero() || c.Before(until) {
			until = c
		}
	}
	return until
}
