package memory_test

import (
	"context"
	"testing"
	"time"

	"github.com/envoyrls/envoy-rls/internal/testutil"
	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/algorithms/algotest"
	"github.com/envoyrls/envoy-rls/pkg/backend"
	"github.com/envoyrls/envoy-rls/pkg/backend/memory"
	"github.com/envoyrls/envoy-rls/pkg/backend/storetest"
)

// memoryDecider returns an algotest decide function that runs each step as a
// one-item Apply on m at the step's instant; with sweep, the store sweeps at
// that instant first.
func memoryDecider(t *testing.T, m *memory.Store, clock *testutil.Clock, l algorithms.Limit, sweep bool) func(time.Time, uint64) algorithms.Decision {
	return func(at time.Time, hits uint64) algorithms.Decision {
		t.Helper()
		clock.Set(at)
		if sweep {
			m.Sweep()
		}
		out := make([]algorithms.Decision, 1)
		ok, err := m.Apply(context.Background(), []backend.Item{{Key: "key", Limit: l, Hits: hits}}, out)
		if err != nil {
			t.Fatalf("Apply: %v", err)
		}
		if ok != out[0].Allowed {
			t.Errorf("verdict %v for a single enforced item decided %v", ok, out[0].Allowed)
		}
		return out[0]
	}
}

// TestMemoryAlgotestCasesSwept runs the shared timelines whose clock only
// moves forward with a sweep before every step: dropping fresh entries must
// never change a decision. (After a clock steps back, a dropped key is
// decided at the sweep's instant instead: see
// TestMemorySweepThenEarlierClock.)
func TestMemoryAlgotestCasesSwept(t *testing.T) {
	ran, dropped := 0, uint64(0)
	for _, c := range algotest.Cases() {
		if !forward(c.Steps) {
			continue
		}
		ran++
		t.Run(c.Name, func(t *testing.T) {
			m, clock := newTestMemory(t)
			algotest.Run(t, c, memoryDecider(t, m, clock, c.Limit, true))
			dropped += m.Stats().Swept
		})
	}
	if ran == 0 || dropped == 0 {
		t.Errorf("ran %d timelines, sweeps dropped %d entries: nothing shown", ran, dropped)
	}
}

func forward(steps []algotest.Step) bool {
	for i := 1; i < len(steps); i++ {
		if steps[i].At < steps[i-1].At {
			return false
		}
	}
	return true
}

// TestConformance runs the store conformance kit: every shared timeline,
// single-key and multi-item, against a fresh store.
func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, clock backend.Clock) backend.Store {
		return memory.New(memory.WithClock(clock), memory.WithSweepInterval(0))
	})
}
