package backend_test

import (
	"testing"
	"time"

	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/backend"
)

var perSecond = algorithms.Limit{Algorithm: algorithms.FixedWindow, Requests: 2, Window: time.Second}

// txnFor returns working space for items over keys distinct keys.
func txnFor(keyOf []int, keys int) *backend.Txn {
	tx := &backend.Txn{
		KeyOf:      keyOf,
		Stored:     make([]*algorithms.State, keys),
		Next:       make([]algorithms.State, keys),
		Charged:    make([]bool, keys),
		ResetAfter: make([]time.Duration, keys),
	}
	for j := range tx.Stored {
		tx.Stored[j] = new(algorithms.State)
	}
	return tx
}

// TestTransactWholeRequestDeniedChargesNothing: a denying Enforced item
// keeps every charge out, and the allowing items report checks of the stored
// state.
func TestTransactWholeRequestDeniedChargesNothing(t *testing.T) {
	items := []backend.Item{
		{Key: "a", Limit: perSecond, Hits: 1},
		{Key: "b", Limit: perSecond, Hits: 3},
	}
	tx := txnFor([]int{0, 1}, 2)
	out := make([]algorithms.Decision, 2)
	if backend.Transact(tx, items, 0, backend.WholeRequest, out) {
		t.Fatal("committed a request whose Enforced item denies")
	}
	if !out[0].Allowed || out[0].Remaining != 2 || out[0].ResetAfter != 0 {
		t.Errorf("allowing item: %+v, want a check of the fresh state (remaining 2)", out[0])
	}
	if out[1].Allowed {
		t.Errorf("denying item: %+v", out[1])
	}
}

// TestTransactPartCommitsUnlessEnforcedDenies: a part commits when only a
// Quota item denies (the other parts decide the verdict), but not when an
// Enforced one does.
func TestTransactPartCommitsUnlessEnforcedDenies(t *testing.T) {
	items := []backend.Item{
		{Key: "a", Limit: perSecond, Hits: 1},
		{Key: "q", Limit: perSecond, Hits: 3, Mode: backend.Quota},
	}
	tx := txnFor([]int{0, 1}, 2)
	out := make([]algorithms.Decision, 2)
	if !backend.Transact(tx, items, 0, backend.PartOfRequest, out) {
		t.Fatal("a part without an Enforced denial did not commit")
	}
	if !tx.Charged[0] || tx.Charged[1] || out[0].Remaining != 1 || tx.ResetAfter[0] != time.Second {
		t.Errorf("charged %v, decisions %+v, reset %v", tx.Charged, out, tx.ResetAfter)
	}
	if backend.Transact(tx, items, 0, backend.WholeRequest, out) {
		t.Error("the whole request committed although its only quota group denies")
	}
	items[1].Mode = backend.Enforced
	if backend.Transact(tx, items, 0, backend.PartOfRequest, out) {
		t.Error("a part with an Enforced denial committed")
	}
}

// TestTransactSameKeyInOrder: the second item of a key sees the first's
// hits, and Next holds the state after both.
func TestTransactSameKeyInOrder(t *testing.T) {
	items := []backend.Item{
		{Key: "k", Limit: perSecond, Hits: 1},
		{Key: "k", Limit: perSecond, Hits: 1},
	}
	tx := txnFor([]int{0, 0}, 1)
	out := make([]algorithms.Decision, 2)
	if !backend.Transact(tx, items, 0, backend.WholeRequest, out) {
		t.Fatal("denied")
	}
	if out[0].Remaining != 1 || out[1].Remaining != 0 {
		t.Errorf("remaining %d then %d, want 1 then 0", out[0].Remaining, out[1].Remaining)
	}
	*tx.Stored[0] = tx.Next[0]
	if backend.Transact(tx, items[:1], 0, backend.WholeRequest, out) || out[0].Allowed {
		t.Errorf("a third hit in the window: %+v, want denied", out[0])
	}
}

// TestTransactAllocatesNothing: with its working space given, Transact
// allocates nothing (a sliding_window_log state may allocate its own log
// as it grows; that is pkg/algorithms', not the transaction's).
func TestTransactAllocatesNothing(t *testing.T) {
	items := []backend.Item{
		{Key: "a", Limit: perSecond, Hits: 1},
		{Key: "b", Limit: algorithms.Limit{Algorithm: algorithms.TokenBucket, Requests: 5, Window: time.Second}, Hits: 1, Mode: backend.Shadow},
		{Key: "c", Limit: perSecond, Hits: 1, Mode: backend.Quota, Group: 3},
	}
	tx := txnFor([]int{0, 1, 2}, 3)
	out := make([]algorithms.Decision, 3)
	now := int64(0)
	allocs := testing.AllocsPerRun(100, func() {
		now += 1_000_000
		backend.Transact(tx, items, now, backend.WholeRequest, out)
	})
	if allocs != 0 {
		t.Errorf("Transact allocated %v times per call", allocs)
	}
}

func TestModeString(t *testing.T) {
	for m, want := range map[backend.Mode]string{backend.Enforced: "enforced", backend.Shadow: "shadow", backend.Quota: "quota", 7: "Mode(7)"} {
		if got := m.String(); got != want {
			t.Errorf("Mode(%d).String() = %q, want %q", m, got, want)
		}
	}
}
