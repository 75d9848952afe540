package storetest_test

import (
	"context"
	"testing"
	"time"

	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/algorithms/algotest"
	"github.com/envoyrls/envoy-rls/pkg/backend"
	"github.com/envoyrls/envoy-rls/pkg/backend/storetest"
)

// TestCasesAreWellFormed: unique names (also against algotest's), one
// decision per item, valid limits.
func TestCasesAreWellFormed(t *testing.T) {
	names := map[string]bool{}
	for _, c := range algotest.Cases() {
		names[c.Name] = true
	}
	for _, c := range storetest.Cases() {
		if names[c.Name] {
			t.Errorf("duplicate case %q", c.Name)
		}
		names[c.Name] = true
		for i, st := range c.Steps {
			if len(st.Items) != len(st.Want) {
				t.Errorf("%s step %d: %d items, %d decisions", c.Name, i, len(st.Items), len(st.Want))
			}
			for _, it := range st.Items {
				if err := it.Limit.Validate(); err != nil {
					t.Errorf("%s step %d: %v", c.Name, i, err)
				}
			}
		}
	}
}

// TestCasesAgainstModel: backend.Transact over a map passes the tables.
func TestCasesAgainstModel(t *testing.T) {
	for _, c := range storetest.Cases() {
		t.Run(c.Name, func(t *testing.T) {
			m := storetest.Model{}
			storetest.RunCase(t, c, func(at time.Time, items []backend.Item) (bool, []algorithms.Decision) {
				ds, ok := m.Apply(items, at)
				return ok, ds
			})
		})
	}
}

// refBackend is Model as a backend.Store on a clock.
type refBackend struct {
	clock backend.Clock
	m     storetest.Model
}

func (r *refBackend) Apply(_ context.Context, items []backend.Item, out []algorithms.Decision) (bool, error) {
	ds, ok := r.m.Apply(items, r.clock.Now())
	copy(out, ds)
	return ok, nil
}

func (r *refBackend) Close() error { return nil }

// TestRunPassesTheReference: the kit itself passes a store that follows the
// contract.
func TestRunPassesTheReference(t *testing.T) {
	storetest.Run(t, func(t *testing.T, clock backend.Clock) backend.Store {
		return &refBackend{clock: clock, m: storetest.Model{}}
	})
}

// recorder counts the failures reported to it instead of failing the test.
type recorder struct {
	testing.TB
	errors int
}

func (r *recorder) Helper()                   {}
func (r *recorder) Errorf(string, ...any)     { r.errors++ }
func (r *recorder) Fatalf(f string, a ...any) { r.errors++ }

// TestRunCaseReportsFailures: RunCase reports every step whose decisions
// differ, and nothing when they agree.
func TestRunCaseReportsFailures(t *testing.T) {
	sc := storetest.Cases()[0]
	r := &recorder{TB: t}
	storetest.RunCase(r, sc, func(_ time.Time, items []backend.Item) (bool, []algorithms.Decision) {
		return false, make([]algorithms.Decision, len(items)+1)
	})
	want := len(sc.Steps) // one per step for the count of decisions
	for _, st := range sc.Steps {
		if st.WantAllowed {
			want++ // and one for the verdict
		}
	}
	if r.errors != want {
		t.Errorf("RunCase reported %d failures, want %d", r.errors, want)
	}
	i := 0
	r = &recorder{TB: t}
	storetest.RunCase(r, sc, func(time.Time, []backend.Item) (bool, []algorithms.Decision) {
		i++
		return sc.Steps[i-1].WantAllowed, sc.Steps[i-1].Want
	})
	if r.errors != 0 {
		t.Errorf("RunCase reported %d failures for right decisions", r.errors)
	}
}
