package redis

import (
	"context"
	"time"

	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/backend"
)

// refundTimeout bounds a refund: its wait for a pipeline and, through the
// client's timeouts, its round trip. A caller does not wait for it past its
// own deadline; the refund goes on without it, within this bound.
const refundTimeout = time.Second

// refund takes back the admission charges that the slots of a denied
// request split across Cluster slots (c) made: each slot's script call
// decided its part alone and charged its allowing items, as no call saw
// the others' decisions. One script call per charged slot, all in one
// pipeline: one more round trip, only for a denied request whose keys fall
// into several slots. Usage accounting stays charged; so does everything
// when the refund cannot be made (RefundsFailed), as before refunds. On
// success the refunded items' Decisions report their key's state as it
// stays, as a denied request's allowing items do on one slot.
func (r *Store) refund(ctx context.Context, c *call, items []backend.Item, out []algorithms.Decision) {
	rc := refundCall(c)
	if rc == nil {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), refundTimeout)
	rc.ctx, rc.now = rctx, nowArg(r.clock)
	rc.until, _ = rctx.Deadline()
	if !r.enqueue(rc) {
		cancel()
		r.refundsFailed.Add(1)
		return
	}
	var timeout <-chan time.Time
	if !c.until.IsZero() {
		t := time.NewTimer(time.Until(c.until))
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-rc.done:
	case <-ctx.Done():
		if rc.abandon() {
			r.leaveRefund(rc, cancel)
			return
		}
		<-rc.done // the worker finished as the caller was leaving
	case <-timeout:
		if rc.abandon() {
			r.leaveRefund(rc, cancel)
			return
		}
		<-rc.done
	}
	cancel()
	r.settleRefund(rc, items, out)
}

// leaveRefund is for a caller whose time is up before its refund
// finished: the refund goes on (the worker resolves the call, within
// refundTimeout), and is counted then.
func (r *Store) leaveRefund(rc *call, cancel context.CancelFunc) {
	rc.onLate(func([]bool) {
		cancel()
		r.settleRefund(rc, nil, nil)
	})
}

// refundCall returns the refunds of a call split across slots, one group
// per slot of the charged groups (nil when nothing is to be taken back): an
// item is refunded when its group committed, it allowed and was charged by
// its admission, hits > 0, and it is not usage accounting. The group's
// other allowing items but usage accounting go along as checks, to report
// their key's state as it stays.
func refundCall(c *call) *call {
	var rc *call
	for gi := range c.groups {
		g := &c.groups[gi]
		if len(g.reply) != g.replyLen() || g.reply[0] != 1 {
			continue
		}
		// A key also charged by usage accounting keeps every charge: the
		// accounting's own outcome may depend on the charge before it (a
		// full log records none, a bucket's debt is capped), and taking
		// the charge back could take part of the accounting with it.
		var accounted map[string]bool
		for k := range g.items {
			if g.items[k].bits&bitAccount != 0 {
				if accounted == nil {
					accounted = map[string]bool{}
				}
				accounted[g.items[k].key] = true
			}
		}
		// Checks (hits 0) that allowed go along when the group has a
		// charge to take back, to report the state as it stays.
		charged := false
		for k := range g.idx {
			it := &g.items[k]
			if !accounted[it.key] && it.hits > 0 && it.requests > 0 &&
				g.reply[1+replyFields*len(g.idx)+k] >= 0 && g.reply[1+replyFields*k+replyAllowedHi]&1 == 1 {
				charged = true
				break
			}
		}
		if !charged {
			continue
		}
		var rg *group
		for k, i := range g.idx {
			it := g.items[k]
			at := g.reply[1+replyFields*len(g.idx)+k]
			if accounted[it.key] || it.requests == 0 || g.reply[1+replyFields*k+replyAllowedHi]&1 != 1 {
				continue
			}
			if at < 0 {
				it.hits = 0 // a check: nothing to take back
			}
			if rc == nil {
				rc = &call{done: make(chan struct{}, 1), whole: true, items: c.items}
			}
			if rg == nil {
				rc.groups = append(rc.groups, group{slot: g.slot, refund: true})
				rg = &rc.groups[len(rc.groups)-1]
			}
			it.bits, it.at, it.group = bitRefund, at, 0
			rg.idx = append(rg.idx, i)
			rg.items = append(rg.items, it)
		}
	}
	return rc
}

// settleRefund counts a refund's outcome and, for a caller still waiting
// (out not nil), writes the refunded items' decisions.
func (r *Store) settleRefund(rc *call, items []backend.Item, out []algorithms.Decision) {
	if rc.err != nil {
		r.refundsFailed.Add(1)
		return
	}
	for i := range rc.groups {
		g := &rc.groups[i]
		if g.err != nil || len(g.reply) != g.replyLen() {
			r.refundsFailed.Add(1)
			return
		}
	}
	r.refunds.Add(1)
	if out == nil {
		return
	}
	ds := make([]algorithms.Decision, len(items))
	for i := range rc.groups {
		if decodeGroup(&rc.groups[i], items, ds) != nil {
			return // values out of range: the charged state's decisions stay
		}
	}
	for i := range rc.groups {
		g := &rc.groups[i]
		for k, j := range g.idx {
			// A key refunded for several items: each reports the state
			// after the last refund (as the key stays).
			last := j
			for m := len(g.idx) - 1; m > k; m-- {
				if g.items[m].key == g.items[k].key {
					last = g.idx[m]
					break
				}
			}
			out[j] = ds[last]
		}
	}
}
