// Package backend is the storage seam of envoy-rls: a Store keeps the state of
// every counter key and decides a whole request's limits together, all or
// nothing. This package holds the contract only and imports nothing outside
// the module and the standard library; the stores live beside it:
// pkg/backend/memory (embedded, bounded) and pkg/backend/redis, with
// pkg/backend/split routing per-second limits to a store of their own, and
// pkg/backend/storetest is the conformance kit every store runs. Nothing here
// knows about gRPC or YAML, so a Go program can use a Store with
// pkg/algorithms as a plain in-process limiter.
package backend

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/envoyrls/envoy-rls/pkg/algorithms"
)

// Mode says how an item's denial counts towards the request's verdict.
type Mode uint8

const (
	// Enforced items deny the whole request when they deny.
	Enforced Mode = iota
	// Shadow items are evaluated, charged when they allow and the request is
	// allowed, and reported, but never deny the request.
	Shadow
	// Quota items deny the request only when every quota group of the request
	// has at least one denying item (envoyproxy/ratelimit's quota_mode).
	Quota
)

// String returns the mode's name ("enforced", "shadow", "quota"), or
// "Mode(n)" for a value that is not a mode. A new mode gets a name here, and
// the Redis script a constant of the same name (its test checks both).
func (m Mode) String() string {
	switch m {
	case Enforced:
		return "enforced"
	case Shadow:
		return "shadow"
	case Quota:
		return "quota"
	}
	return "Mode(" + strconv.Itoa(int(m)) + ")"
}

// Item is one limit to decide for one counter key.
type Item struct {
	// Key identifies the counter. Two items with the same Key share one
	// state, so a Key must encode the limit's identity (see pkg/rls). Items
	// of one request with the same Key are decided in order, each seeing the
	// hits of the ones before it.
	Key string
	// Limit is the limit to decide. It must be valid.
	Limit algorithms.Limit
	// Hits is the number of hits to charge; 0 checks without charging.
	Hits uint64
	// Mode says how a denial of this item counts.
	Mode Mode
	// Group ties Quota items of one descriptor together: a quota descriptor
	// is over its limit when any of its items denies. Ignored for other modes.
	Group int
	// Partition names the items that must be decided in one step. A store
	// that cannot decide a whole request at once (on a Redis Cluster, a
	// script call decides the items of one hash slot) never splits the items
	// of one non-zero Partition apart; how it places partitions is its own
	// business (the Redis store derives the hash tag from it). Zero places
	// an item by its Key alone. Items with the same Key must have the same
	// Partition. (pkg/backend/split, which keeps short limits in a store of
	// their own, decides a partition with limits on both sides in several
	// steps: see its documentation.)
	Partition uint64
	// Account marks usage accounting: hits that already happened (the cost
	// Envoy reports when a stream is done), which nothing can refuse. When
	// Hits > 0 they are charged whatever the verdict, with
	// algorithms.Account, even when they do not fit (counted past the limit,
	// or carried as debt). Its Decision says whether they fitted and counts
	// towards the verdict as its Mode says. Checks (Hits 0) are decided as
	// usual: they deny once no room is left for one hit.
	Account bool
	// Consistency says where the item may be decided when instances share
	// the store: Strict (the zero value) in the shared store, Lease or
	// Approximate in memory within a stated bound. Only
	// pkg/backend/consistency reads it; every other store decides the
	// item in its own state, as Strict.
	Consistency Consistency
}

// Store decides requests against stored state.
//
// Apply decides items together and writes one Decision per item into out
// (len(out) must be at least len(items)). The request is allowed unless an
// Enforced item denies, or every Quota group has a denying item (see
// Verdict). When it is allowed, every item whose own decision allows is
// charged, and every Account item; when it is denied, only the Account items
// are charged (usage that already happened; their Decisions stay the ones
// the verdict was made of), and the Decisions of the other items that would
// have allowed report their state without this request's hits (Allowed,
// Remaining and ResetAfter of the state as it stays). Apply is safe for concurrent use and exact: no
// interleaving of concurrent calls allows more than the algorithms permit.
//
// An error means the store could not decide (the backend is unreachable or
// too slow for ctx); then nothing is known about what was charged.
type Store interface {
	Apply(ctx context.Context, items []Item, out []algorithms.Decision) (allowed bool, err error)
	Close() error
}

// TakesDeadline is a Store that takes a call's time budget as a deadline
// beside the caller's context: ApplyBy(ctx, until, items, out) decides
// exactly as Apply would under ctx with its deadline moved to until (when
// until is earlier; a zero until adds none), and fails the same way when
// the budget runs out (an error wrapping context.DeadlineExceeded). It
// spares the caller a context with a timer per call. The memory, Redis and
// split stores implement it; ByDeadline adapts any other Store. A type that embeds such a store and overrides
// Apply must override ApplyBy too.
type TakesDeadline interface {
	Store
	ApplyBy(ctx context.Context, until time.Time, items []Item, out []algorithms.Decision) (allowed bool, err error)
}

// ByDeadline returns st as a TakesDeadline: st itself when it is one, else
// a wrapper whose ApplyBy calls st.Apply under ctx, with a context of
// deadline until when until is set. A caller that holds the result calls
// every store the same way.
func ByDeadline(st Store) TakesDeadline {
	if d, ok := st.(TakesDeadline); ok {
		return d
	}
	return withDeadline{st}
}

// withDeadline adapts a Store that takes its deadline from its context.
type withDeadline struct{ Store }

func (s withDeadline) ApplyBy(ctx context.Context, until time.Time, items []Item, out []algorithms.Decision) (bool, error) {
	if until.IsZero() {
		return s.Apply(ctx, items, out)
	}
	ctx, cancel := context.WithDeadline(ctx, until)
	defer cancel()
	return s.Apply(ctx, items, out)
}

// ErrClosed is returned by Apply after Close.
var ErrClosed = errors.New("backend: store is closed")

// Report turns the decision of a check (0 hits) of an item's state into
// the report of an item that allowed in a request that was denied: allowed,
// with the state's Remaining and ResetAfter.
func Report(check algorithms.Decision) algorithms.Decision {
	check.Allowed, check.RetryAfter = true, 0
	return check
}

// Verdict reports whether a request whose items decided as ds is allowed: no
// Enforced item denies, and not every Quota group has a denying item.
func Verdict(items []Item, ds []algorithms.Decision) bool {
	var quotaGroups, deniedGroups uint64 // bit sets of groups 0..63
	overflow := false
	for i := range items {
		it, d := &items[i], &ds[i]
		switch it.Mode {
		case Enforced:
			if !d.Allowed {
				return false
			}
		case Quota:
			if it.Group < 0 || it.Group >= 64 {
				overflow = true
				continue
			}
			quotaGroups |= 1 << it.Group
			if !d.Allowed {
				deniedGroups |= 1 << it.Group
			}
		}
	}
	if overflow {
		return verdictSlow(items, ds)
	}
	return quotaGroups == 0 || deniedGroups != quotaGroups
}

func verdictSlow(items []Item, ds []algorithms.Decision) bool {
	quota := map[int]bool{}
	for i := range items {
		if items[i].Mode == Quota {
			quota[items[i].Group] = quota[items[i].Group] || !ds[i].Allowed
		}
	}
	for _, denied := range quota {
		if !denied {
			return true
		}
	}
	return len(quota) == 0
}

// Clock reads the current time. The memory store reads it once per Apply.
type Clock interface {
	Now() time.Time
}

// monotonicClock reads the wall clock once and then advances it with the
// process's monotonic clock, so wall-clock steps never move it backwards.
type monotonicClock struct{ start time.Time }

// MonotonicClock returns a Clock that starts at the current wall time and
// then only moves forward, following the monotonic clock.
func MonotonicClock() Clock { return monotonicClock{start: time.Now()} }

func (c monotonicClock) Now() time.Time {
	return c.start.Add(time.Since(c.start)).Round(0)
}
