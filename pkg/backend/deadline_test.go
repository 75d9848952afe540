package backend_test

import (
	"context"
	"testing"
	"time"

	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/backend"
	"github.com/envoyrls/envoy-rls/pkg/backend/memory"
)

// contextStore decides with a memory store through Apply only, and records
// the context each call gets.
type contextStore struct {
	m   *memory.Store
	ctx context.Context
}

func (c *contextStore) Apply(ctx context.Context, items []backend.Item, out []algorithms.Decision) (bool, error) {
	c.ctx = ctx
	return c.m.Apply(ctx, items, out)
}

func (c *contextStore) Close() error { return c.m.Close() }

// TestByDeadline: a store that takes a deadline is used as it is; any other
// gets ApplyBy's deadline as its context's (the earlier of the two), and
// the caller's context unchanged when there is none.
func TestByDeadline(t *testing.T) {
	m := memory.New()
	defer m.Close()
	if got := backend.ByDeadline(m); got != backend.TakesDeadline(m) {
		t.Fatalf("ByDeadline(memory store) = %T, want the store itself", got)
	}
	rec := &contextStore{m: m}
	st := backend.ByDeadline(rec)
	items := []backend.Item{{Key: "k", Limit: algorithms.Limit{Requests: 2, Window: time.Minute}, Hits: 1}}
	out := make([]algorithms.Decision, 1)
	caller, cancel := context.WithDeadline(context.Background(), time.Now().Add(time.Hour))
	defer cancel()
	callerDeadline, _ := caller.Deadline()
	soon := time.Now().Add(time.Minute)
	for i, tc := range []struct {
		until time.Time
		want  time.Time
	}{
		{time.Time{}, callerDeadline},
		{soon, soon},
		{callerDeadline.Add(time.Hour), callerDeadline},
	} {
		allowed, err := st.ApplyBy(caller, tc.until, items, out)
		if err != nil || allowed != (i < 2) || out[0].Allowed != (i < 2) {
			t.Fatalf("call %d: %v %v %+v, want the memory store's decision (2 allowed, then denied)", i, allowed, err, out[0])
		}
		if d, _ := rec.ctx.Deadline(); !d.Equal(tc.want) {
			t.Errorf("call %d with until %v: the store's deadline is %v, want %v", i, tc.until, d, tc.want)
		}
		if tc.until.IsZero() && rec.ctx != caller {
			t.Errorf("call %d without until: the store got a context of its own, want the caller's", i)
		}
	}
	past := time.Now().Add(-time.Second)
	if _, err := st.ApplyBy(context.Background(), past, items, out); err != nil {
		t.Errorf("past deadline: %v (the memory store never waits, so it decides)", err)
	}
	if d, ok := rec.ctx.Deadline(); !ok || !d.Equal(past) {
		t.Errorf("past deadline: the store's deadline %v (%v), want %v", d, ok, past)
	}
}
