package split_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/envoyrls/envoy-rls/internal/testutil"
	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/algorithms/algotest"
	"github.com/envoyrls/envoy-rls/pkg/backend"
	"github.com/envoyrls/envoy-rls/pkg/backend/memory"
	"github.com/envoyrls/envoy-rls/pkg/backend/split"
	"github.com/envoyrls/envoy-rls/pkg/backend/storetest"
)

// byPrefix routes keys starting with "s/" to the per-second store.
func byPrefix(it *backend.Item) bool { return strings.HasPrefix(it.Key, "s/") }

func fw(requests uint64) algorithms.Limit {
	return algorithms.Limit{Requests: requests, Window: time.Minute}
}

func ok(limit, remaining uint64, reset time.Duration) algorithms.Decision {
	return algorithms.Decision{Allowed: true, Limit: limit, Remaining: remaining, ResetAfter: reset}
}

func no(limit, remaining uint64, retry, reset time.Duration) algorithms.Decision {
	return algorithms.Decision{Limit: limit, Remaining: remaining, RetryAfter: retry, ResetAfter: reset}
}

func quota(key string, l algorithms.Limit, hits uint64, g int) backend.Item {
	return backend.Item{Key: key, Limit: l, Hits: hits, Mode: backend.Quota, Group: g}
}

// newMemorySplit returns a split store on two memory stores driven by one
// test clock, with the stores themselves for inspection.
func newMemorySplit(t *testing.T, opts split.Options) (*split.Store, *memory.Store, *memory.Store) {
	clock := testutil.NewClock(algotest.Base)
	main, ps := memory.New(memory.WithClock(clock)), memory.New(memory.WithClock(clock))
	s := split.New(main, ps, opts)
	t.Cleanup(func() { s.Close() })
	return s, main, ps
}

// Quota groups whose items are in both stores: the verdict is the
// request's, not each store's. Fixed windows of a minute from Base (aligned
// to the minute), every step at Base.
func TestQuotaGroupsAcrossStores(t *testing.T) {
	const m = time.Minute
	c := storetest.Case{Name: "quota_across_stores", Steps: []storetest.Step{
		{WantAllowed: true,
			Items: []backend.Item{quota("s/q", fw(1), 1, 0), quota("m/q", fw(5), 1, 1), {Key: "s/e", Limit: fw(10), Hits: 1}},
			Want:  []algorithms.Decision{ok(1, 0, m), ok(5, 4, m), ok(10, 9, m)}},
		// Group 0 (per-second store only) denies, group 1 (main) is open:
		// allowed, so the per-second store must charge s/e although the
		// only quota group it sees is denied.
		{WantAllowed: true,
			Items: []backend.Item{quota("s/q", fw(1), 1, 0), quota("m/q", fw(5), 1, 1), {Key: "s/e", Limit: fw(10), Hits: 1}},
			Want:  []algorithms.Decision{no(1, 0, m, m), ok(5, 3, m), ok(10, 8, m)}},
		// Both groups deny: denied, nothing charged.
		{WantAllowed: false,
			Items: []backend.Item{quota("s/q", fw(1), 1, 0), quota("m/q", fw(5), 4, 1), {Key: "s/e", Limit: fw(10), Hits: 1}},
			Want:  []algorithms.Decision{no(1, 0, m, m), no(5, 3, m, m), ok(10, 8, m)}},
		// One group with an item in each store.
		{WantAllowed: true,
			Items: []backend.Item{quota("s/g", fw(1), 1, 2), quota("m/g", fw(1), 1, 2)},
			Want:  []algorithms.Decision{ok(1, 0, m), ok(1, 0, m)}},
		// Its per-second item denies: the group, the only one, is denied,
		// so the main item is not charged.
		{WantAllowed: false,
			Items: []backend.Item{quota("s/g", fw(1), 1, 2), quota("m/g2", fw(5), 1, 2)},
			Want:  []algorithms.Decision{no(1, 0, m, m), ok(5, 5, 0)}},
		// Its main item denies while the per-second one would allow: the
		// per-second item is not charged.
		{WantAllowed: false,
			Items: []backend.Item{quota("s/g2", fw(5), 1, 3), quota("m/g", fw(1), 1, 3)},
			Want:  []algorithms.Decision{ok(5, 5, 0), no(1, 0, m, m)}},
		{WantAllowed: true,
			Items: []backend.Item{{Key: "m/g2", Limit: fw(5)}, {Key: "s/g2", Limit: fw(5)}, {Key: "m/q", Limit: fw(5)}},
			Want:  []algorithms.Decision{ok(5, 5, 0), ok(5, 5, 0), ok(5, 3, m)}},
	}}
	s, _, _ := newMemorySplit(t, split.Options{PerSecond: byPrefix})
	storetest.RunCase(t, c, func(_ time.Time, items []backend.Item) (bool, []algorithms.Decision) {
		out := make([]algorithms.Decision, len(items))
		allowed, err := s.Apply(context.Background(), items, out)
		if err != nil {
			t.Fatal(err)
		}
		return allowed, out
	})
}

// The default routing sends limits of a second or less to the per-second
// store, longer ones (a unit_multiplier above 1 included) to the main one.
func TestPerSecondLimit(t *testing.T) {
	for _, c := range []struct {
		window time.Duration
		want   bool
	}{{time.Second, true}, {500 * time.Millisecond, true}, {time.Microsecond, true},
		{time.Second + time.Microsecond, false}, {2 * time.Second, false}, {time.Minute, false}, {24 * time.Hour, false}} {
		if got := split.PerSecondLimit(&backend.Item{Limit: algorithms.Limit{Requests: 1, Window: c.window}}); got != c.want {
			t.Errorf("window %v: per-second %v, want %v", c.window, got, c.want)
		}
	}
}

// A request whose items all go to one store is passed to it as it is: the
// other store is never called.
func TestSingleStoreRequests(t *testing.T) {
	s, main, ps := newMemorySplit(t, split.Options{})
	out := make([]algorithms.Decision, 2)
	sec := algorithms.Limit{Requests: 3, Window: time.Second}
	if ok, err := s.Apply(context.Background(), []backend.Item{{Key: "a", Limit: sec, Hits: 1}, {Key: "b", Limit: sec, Hits: 1}}, out); err != nil || !ok {
		t.Fatalf("per-second request: %v %v", ok, err)
	}
	if ok, err := s.Apply(context.Background(), []backend.Item{{Key: "c", Limit: fw(3), Hits: 1}}, out); err != nil || !ok {
		t.Fatalf("minute request: %v %v", ok, err)
	}
	if k := ps.Stats().Keys; k != 2 {
		t.Errorf("per-second store holds %d keys, want 2", k)
	}
	if k := main.Stats().Keys; k != 1 {
		t.Errorf("main store holds %d keys, want 1", k)
	}
	if st := s.Stats(); st.Mixed != 0 || st.Peeks != 0 {
		t.Errorf("stats %+v: no request was mixed", st)
	}
}
