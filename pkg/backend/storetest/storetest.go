// Package storetest is the conformance kit of backend.Store, in the manner
// of testing/fstest: a store implementation passes when
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T, clock backend.Clock) backend.Store {
//			return mystore.New(mystore.WithClock(clock))
//		})
//	}
//
// passes. Run plays every single-key timeline of pkg/algorithms/algotest as
// one-item requests, and every multi-item timeline of Cases (composite
// limits, all-or-nothing charging, shadow and quota modes, items sharing a
// key, checks), each against a fresh store whose clock the kit moves to the
// step's instant.
//
// Every expected value was worked out by hand from the documented semantics
// of pkg/algorithms and pkg/backend, never by running the code under test.
package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/envoyrls/envoy-rls/internal/testutil"
	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/algorithms/algotest"
	"github.com/envoyrls/envoy-rls/pkg/backend"
)

// Step is one request of several items, decided together by a Store at
// algotest.Base+At. WantAllowed is the request's verdict and Want holds one
// decision per item.
type Step struct {
	At          time.Duration
	Items       []backend.Item
	WantAllowed bool
	Want        []algorithms.Decision
}

// Case is a timeline of multi-item requests against a fresh store. Keys are
// plain strings; a store test may prefix them.
type Case struct {
	Name  string
	Steps []Step
}

// RunCase plays c against apply, which must decide the items together at
// the given instant (as Store.Apply does) and return the verdict and one
// decision per item. Failures are reported as "step %d".
func RunCase(t testing.TB, c Case, apply func(at time.Time, items []backend.Item) (bool, []algorithms.Decision)) {
	t.Helper()
	for i, st := range c.Steps {
		allowed, got := apply(algotest.Base.Add(st.At), st.Items)
		if allowed != st.WantAllowed {
			t.Errorf("%s: step %d (at %v): allowed = %v, want %v", c.Name, i, st.At, allowed, st.WantAllowed)
		}
		if len(got) != len(st.Want) {
			t.Errorf("%s: step %d (at %v): %d decisions, want %d", c.Name, i, st.At, len(got), len(st.Want))
			continue
		}
		for j := range got {
			if got[j] != st.Want[j] {
				it := st.Items[j]
				t.Errorf("%s: step %d (at %v) item %d (key %q, hits %d):\n got  %s\n want %s",
					c.Name, i, st.At, j, it.Key, it.Hits, algotest.Format(got[j]), algotest.Format(st.Want[j]))
			}
		}
	}
}

// NewStore returns a fresh, empty store whose Apply decides at clock.Now().
// Run closes it when the subtest that asked for it ends.
type NewStore func(t *testing.T, clock backend.Clock) backend.Store

// Option adjusts what Run requires of a store.
type Option func(*config)

type config struct {
	inexactHuge bool
}

// InexactHugeCounts accepts decisions that differ from the tables in the
// timelines marked Huge (counts of 2^53 and more), for a store that counts
// in doubles, as a Lua script does. Such a store must still report the exact
// Limit and deny for ever a request of more hits than the capacity.
func InexactHugeCounts() Option { return func(c *config) { c.inexactHuge = true } }

// Run runs the conformance tables against stores made by newStore: every
// timeline of algotest.Cases as one-item requests (subtest "Timelines") and
// every timeline of Cases (subtest "Requests"), each on a fresh store.
func Run(t *testing.T, newStore NewStore, opts ...Option) {
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	fresh := func(t *testing.T) (backend.Store, *testutil.Clock) {
		clock := testutil.NewClock(algotest.Base)
		s := newStore(t, clock)
		t.Cleanup(func() { s.Close() })
		return s, clock
	}
	t.Run("Timelines", func(t *testing.T) {
		for _, c := range algotest.Cases() {
			t.Run(c.Name, func(t *testing.T) {
				s, clock := fresh(t)
				decide := func(at time.Time, hits uint64) algorithms.Decision {
					t.Helper()
					clock.Set(at)
					out := make([]algorithms.Decision, 1)
					ok, err := s.Apply(context.Background(), []backend.Item{{Key: "key", Limit: c.Limit, Hits: hits}}, out)
					if err != nil {
						t.Fatalf("Apply: %v", err)
					}
					if ok != out[0].Allowed {
						t.Errorf("verdict %v for a single enforced item decided %v", ok, out[0].Allowed)
					}
					return out[0]
				}
				if !c.Huge || !cfg.inexactHuge {
					algotest.Run(t, c, decide)
					return
				}
				for j, st := range c.Steps {
					got := decide(algotest.Base.Add(st.At), st.Hits)
					if got.Limit != st.Want.Limit {
						t.Errorf("step %d: limit %d, want %d", j, got.Limit, st.Want.Limit)
					}
					if st.Hits > c.Limit.Capacity() && (got.Allowed || got.RetryAfter != algorithms.Never) {
						t.Errorf("step %d: %d hits over a capacity of %d: %s, want denied for ever",
							j, st.Hits, c.Limit.Capacity(), algotest.Format(got))
					}
					if got != st.Want {
						t.Logf("step %d differs as the table allows: got %s, exact %s", j, algotest.Format(got), algotest.Format(st.Want))
					}
				}
			})
		}
	})
	t.Run("Requests", func(t *testing.T) {
		for _, c := range Cases() {
			t.Run(c.Name, func(t *testing.T) {
				s, clock := fresh(t)
				RunCase(t, c, func(at time.Time, items []backend.Item) (bool, []algorithms.Decision) {
					t.Helper()
					clock.Set(at)
					out := make([]algorithms.Decision, len(items))
					ok, err := s.Apply(context.Background(), items, out)
					if err != nil {
						t.Fatalf("Apply: %v", err)
					}
					return ok, out
				})
			})
		}
	})
}
