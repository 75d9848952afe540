package redis

import (
	"math"
	"time"

	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/backend"
)

// denial is what the local deny cache remembers of a key that Redis denied.
type denial struct {
	until     int64  // µs on denyClock: until then, hits >= hits are denied
	hits      uint64 // the hits that were denied
	limit     uint64
	remaining uint64
	resetAt   int64         // µs on denyClock, math.MaxInt64 for never
	ttl       time.Duration // the entry's lifetime in the cache
	// lim is the limit that denied. Counter keys leave the count out (a
	// reload or an override may change it on the same key), so a remembered
	// denial answers only items of the same limit.
	lim algorithms.Limit
}

// fromDenyCache answers the request from the local deny cache at instant
// now (µs on denyClock) if every item is a remembered denial (see Apply).
func (r *Store) fromDenyCache(now int64, items []backend.Item, out []algorithms.Decision) (bool, bool) {
	for i := range items {
		it := &items[i]
		if it.Hits == 0 || it.Account {
			// Checks, and usage that must be charged, always go to Redis.
			return false, false
		}
		d, ok := r.deny.GetIfPresent(it.Key)
		if !ok || now >= d.until || it.Hits < d.hits || it.Limit != d.lim {
			return false, false
		}
		reset := algorithms.Never
		if d.resetAt != math.MaxInt64 {
			reset = time.Duration(max(d.resetAt-now, 0)) * time.Microsecond
		}
		out[i] = algorithms.Decision{
			Limit:      d.limit,
			Remaining:  d.remaining,
			RetryAfter: time.Duration(d.until-now) * time.Microsecond,
			ResetAfter: reset,
		}
	}
	return backend.Verdict(items, out), true
}

// rememberDenials records the denials of a decided request in the local
// deny cache. Only an item decided on the stored state counts: the first
// of its key in the request (a later one saw the earlier ones' hits, which
// a denied request does not charge). Denials that can never pass (Never)
// are not remembered: they depend on the hits alone. now (µs on denyClock)
// was read before the request was sent, so no earlier than the instant the
// script decided at minus the time since.
func (r *Store) rememberDenials(now int64, items []backend.Item, out []algorithms.Decision) {
	for i := range items {
		d := &out[i]
		if d.Allowed || items[i].Hits == 0 || items[i].Account || d.RetryAfter <= 0 || d.RetryAfter == algorithms.Never {
			continue
		}
		first := true
		for j := 0; j < i; j++ {
			if items[j].Key == items[i].Key {
				first = false
				break
			}
		}
		if !first {
			continue
		}
		resetAt := int64(math.MaxInt64)
		if d.ResetAfter != algorithms.Never {
			resetAt = now + d.ResetAfter.Microseconds()
		}
		r.deny.Set(items[i].Key, denial{
			until:     now + d.RetryAfter.Microseconds(),
			hits:      items[i].Hits,
			limit:     d.Limit,
			remaining: d.Remaining,
			resetAt:   resetAt,
			ttl:       d.RetryAfter,
			lim:       items[i].Limit,
		})
	}
}
