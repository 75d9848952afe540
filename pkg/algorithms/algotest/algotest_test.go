package algotest_test

import (
	"testing"
	"time"

	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/algorithms/algotest"
)

// wholeMicros reports whether d is a whole number of µs (or Never).
func wholeMicros(d time.Duration) bool {
	return d == algorithms.Never || d%time.Microsecond == 0
}

// TestTablesAreWellFormed: unique names, valid limits, whole µs everywhere
// (so that a twin working in µs can reproduce them), a Limit field that
// matches the limit's capacity, and coverage of every algorithm.
func TestTablesAreWellFormed(t *testing.T) {
	names := map[string]bool{}
	perKind := map[algorithms.Kind]int{}
	for _, c := range algotest.Cases() {
		if names[c.Name] {
			t.Errorf("duplicate case %q", c.Name)
		}
		names[c.Name] = true
		perKind[c.Limit.Algorithm]++
		if err := c.Limit.Validate(); err != nil {
			t.Errorf("%s: %v", c.Name, err)
		}
		if len(c.Steps) == 0 {
			t.Errorf("%s: no steps", c.Name)
		}
		for i, st := range c.Steps {
			if !wholeMicros(st.At) || !wholeMicros(st.Want.RetryAfter) || !wholeMicros(st.Want.ResetAfter) {
				t.Errorf("%s step %d: not whole µs: %+v", c.Name, i, st)
			}
			if st.Want.Limit != c.Limit.Capacity() {
				t.Errorf("%s step %d: Limit %d, capacity %d", c.Name, i, st.Want.Limit, c.Limit.Capacity())
			}
			if st.Want.Allowed && st.Want.RetryAfter != 0 {
				t.Errorf("%s step %d: allowed with a RetryAfter", c.Name, i)
			}
			if !st.Want.Allowed && st.Want.RetryAfter == 0 {
				t.Errorf("%s step %d: denied without a RetryAfter", c.Name, i)
			}
		}
	}
	for _, k := range algorithms.Kinds() {
		if perKind[k] < 6 {
			t.Errorf("%s: only %d cases", k, perKind[k])
		}
	}
}

// recorder counts the failures reported to it instead of failing the test.
type recorder struct {
	testing.TB
	errors int
}

func (r *recorder) Helper()                   {}
func (r *recorder) Errorf(string, ...any)     { r.errors++ }
func (r *recorder) Fatalf(f string, a ...any) { r.errors++ }

// TestRunReportsFailures: Run reports every step whose decisions
// differ, and nothing when they agree.
func TestRunReportsFailures(t *testing.T) {
	c := algotest.Cases()[0]
	r := &recorder{TB: t}
	algotest.Run(r, c, func(time.Time, uint64) algorithms.Decision { return algorithms.Decision{} })
	if r.errors != len(c.Steps) {
		t.Errorf("Run reported %d failures for %d wrong steps", r.errors, len(c.Steps))
	}
	i := 0
	r = &recorder{TB: t}
	algotest.Run(r, c, func(time.Time, uint64) algorithms.Decision { i++; return c.Steps[i-1].Want })
	if r.errors != 0 {
		t.Errorf("Run reported %d failures for right decisions", r.errors)
	}
}

func TestFormat(t *testing.T) {
	got := algotest.Format(algorithms.Decision{Limit: 3, Remaining: 1, RetryAfter: algorithms.Never, ResetAfter: 1500 * time.Microsecond})
	if want := "denied limit=3 remaining=1 retry=never reset=1500µs"; got != want {
		t.Errorf("Format = %q, want %q", got, want)
	}
}
