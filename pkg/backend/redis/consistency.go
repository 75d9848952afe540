package redis

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/backend"
)

// Routing by consistency (backend.Item.Consistency).
//
// A Strict item is decided by the script, in Redis. A Lease or Approximate
// item goes to the local path of its consistency (lease.go, approximate.go),
// which may decide it from memory (take) or decline; a declined item is
// decided strict with the rest of the request, and its path is told the
// outcome (observe). A request stays all or nothing across paths:
//
//   - the local paths take first, holding the hits they allow;
//   - the items left are sent to Redis as one request. When a held item of
//     an Enforced mode denied, the request is denied whatever Redis says, so
//     Redis gets with them one item that always denies (a limit of zero
//     requests on a key of its own, which the script never writes): it then
//     charges nothing but usage accounting, and reports each item as for any
//     denied request;
//   - the held hits are kept when the request is allowed and put back when
//     it is denied or Redis fails without a fallback (settle).
//
// Quota items are always strict: a quota group is denied only when every
// group has a denying item, which one part alone cannot tell, while
// Enforced and Shadow items held locally change the verdict of the rest
// only by denying. Items with a Partition of zero placed on a Redis Cluster
// by their Key may fall in other slots than the always-denying item, where
// the store's usual rule for split requests applies (see Store).

// localPath decides the items of one consistency from memory. Its methods
// are safe for concurrent use.
type localPath interface {
	// take decides it from memory into *d and holds its hits (charged in
	// memory, pending settle), or reports false: Redis then decides it.
	take(it *backend.Item, d *algorithms.Decision) (hold, bool)
	// settle ends a hold: keep the hits (commit), or put them back and
	// report in *d the state as it stays (backend.Report).
	settle(it *backend.Item, h hold, commit bool, d *algorithms.Decision)
	// observe is told Redis's decision of an item it declined to take, in
	// a request that Redis decided (whether or not it was allowed).
	observe(it *backend.Item, d *algorithms.Decision)
	// close returns or sends what the path holds, by the deadline of ctx;
	// the Redis client is still open. Called once, by Store.Close.
	close(ctx context.Context) error
}

// hold is what a local path keeps of an item it took until settle: a
// pointer of its own (in an interface without allocating) and numbers.
type hold struct {
	ref any
	n   uint64
	gen uint64
}

// routes reports whether a request has an item that a local path may
// take: otherwise it goes to Redis whole, as before consistencies.
func (r *Store) routes(items []backend.Item) bool {
	if r.lease == nil && r.approx == nil {
		return false
	}
	for i := range items {
		if items[i].Consistency != backend.Strict {
			return true
		}
	}
	return false
}

// pathOf returns the local path of an item, nil for Redis (strict).
func (r *Store) pathOf(it *backend.Item) localPath {
	if it.Mode == backend.Quota {
		return nil
	}
	switch it.Consistency {
	case backend.Lease:
		if r.lease != nil {
			return r.lease
		}
	case backend.Approximate:
		if r.approx != nil {
			return r.approx
		}
	}
	return nil
}

// routed is the working space of one routed request.
type routed struct {
	held   []heldItem
	strict []int // indices of the items sent to Redis
	sub    []backend.Item
	subOut []algorithms.Decision
}

type heldItem struct {
	i    int
	path localPath
	h    hold
}

var routedPool = sync.Pool{New: func() any { return new(routed) }}

// denyKey is the key of the item that always denies (see above): a limit
// of zero requests denies without reading or writing its state.
const denyKey = "\x00envoy-rls:deny"

// applyRouted decides a request of which some items may be decided from
// memory: see the top of this file.
func (r *Store) applyRouted(ctx context.Context, until time.Time, items []backend.Item, out []algorithms.Decision) (bool, error) {
	n := len(items)
	if len(out) < n {
		return r.applyStrict(ctx, until, items, out) // its error
	}
	rt := routedPool.Get().(*routed)
	defer func() {
		clear(rt.held) // the paths' pointers
		rt.held, rt.strict, rt.sub, rt.subOut = rt.held[:0], rt.strict[:0], rt.sub[:0], rt.subOut[:0]
		routedPool.Put(rt)
	}()
	denied := false // a held Enforced item denies
	for i := range items {
		it := &items[i]
		if p := r.pathOf(it); p != nil {
			if h, ok := p.take(it, &out[i]); ok {
				rt.held = append(rt.held, heldItem{i: i, path: p, h: h})
				if !out[i].Allowed && it.Mode == backend.Enforced {
					denied = true
				}
				continue
			}
		}
		rt.strict = append(rt.strict, i)
	}
	if len(rt.strict) == 0 {
		allowed := backend.Verdict(items, out[:n])
		r.settleHeld(rt, items, out, allowed)
		r.requests.Add(1)
		chunk := true
		for _, h := range rt.held {
			chunk = chunk && h.path == r.lease
		}
		if chunk {
			r.chunkDecided.Add(1)
		} else {
			r.approxDecided.Add(1)
		}
		return allowed, nil
	}
	for _, i := range rt.strict {
		rt.sub = append(rt.sub, items[i])
	}
	if denied {
		rt.sub = r.appendDenials(rt.sub)
	}
	if cap(rt.subOut) < len(rt.sub) {
		rt.subOut = make([]algorithms.Decision, len(rt.sub))
	}
	rt.subOut = rt.subOut[:len(rt.sub)]
	allowed, err := r.applyStrict(ctx, until, rt.sub, rt.subOut)
	if err != nil {
		r.settleHeld(rt, items, out, false)
		return false, err
	}
	for k, i := range rt.strict {
		out[i] = rt.subOut[k]
		if p := r.pathOf(&items[i]); p != nil {
			p.observe(&items[i], &out[i])
		}
	}
	allowed = allowed && !denied
	r.settleHeld(rt, items, out, allowed)
	return allowed, nil
}

// appendDenials appends to sub one always-denying item per distinct
// partition of its items (one slot each on a Cluster).
func (r *Store) appendDenials(sub []backend.Item) []backend.Item {
	deny := backend.Item{Key: denyKey, Limit: algorithms.Limit{Window: time.Second}, Hits: 1}
	m := len(sub)
	for k := 0; k < m; k++ {
		p := sub[k].Partition
		seen := false
		for j := m; j < len(sub); j++ {
			if sub[j].Partition == p {
				seen = true
				break
			}
		}
		if !seen {
			deny.Partition = p
			sub = append(sub, deny)
			if !r.cluster {
				break
			}
		}
	}
	return sub
}

// settleHeld ends the holds of a request: kept when it is allowed.
func (r *Store) settleHeld(rt *routed, items []backend.Item, out []algorithms.Decision, allowed bool) {
	for _, h := range rt.held {
		h.path.settle(&items[h.i], h.h, allowed, &out[h.i])
	}
}

// closeLocal closes the local paths (Store.Close, before the client
// closes): each returns or sends what it holds within d.
func (r *Store) closeLocal(d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var errs []error
	for _, p := range []localPath{r.lease, r.approx} {
		if p != nil {
			errs = append(errs, p.close(ctx))
		}
	}
	return errors.Join(errs...)
}
