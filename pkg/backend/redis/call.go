package redis

import (
	"context"
	"sync"
	"time"
)

// call is one Apply waiting for its script calls. The worker that runs it
// touches only the call's own fields, never the caller's items or out, so
// a caller may leave at its deadline while the call is in flight.
type call struct {
	ctx    context.Context
	until  time.Time // the call's deadline: ctx's, or ApplyBy's earlier one (zero: none)
	timed  bool      // until is ApplyBy's, earlier than ctx's: the caller waits with timer
	timer  *time.Timer
	now    int64 // the requests' now in ARGV (-1: Redis's TIME)
	whole  bool  // false: the request is split across Cluster slots
	taken  bool  // a worker took it for a pipeline (under Store.mu)
	groups []group
	err    error         // set before done is signalled when the call was not sent
	done   chan struct{} // one token (room for one) when every group has its result

	// A caller that leaves before done (its deadline passed) abandons the
	// call; the worker then resolves it on its own, once the reply arrives
	// or the call is dropped, and hands the outcome to late (see
	// Store.degrade).
	mu        sync.Mutex
	state     callState
	late      func(charged []bool) // set by the caller after abandoning
	resolved  bool                 // the outcome is known
	chargedBy []bool               // per item: Redis charged it (nil: nothing charged)
	items     int                  // number of items of the request

	// Storage for the common case, one group of one item, so that a
	// call is one allocation (see newCall).
	groupBuf [1]group
	idxBuf   [1]int
	itemBuf  [1]item
}

type callState uint8

const (
	waiting   callState = iota // the caller waits for done
	finished                   // the worker finished first: the caller reads the result
	abandoned                  // the caller left first: the worker resolves the call
)

// abandon is called by a caller that leaves before done. It reports false
// when the worker finished first, so the caller should read the result.
func (c *call) abandon() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.state == finished {
		return false
	}
	c.state = abandoned
	return true
}

// finish is called by the worker when the call's result is known: charged
// (per item, nil when nothing was charged) is handed to the late handler
// when the caller abandoned the call. It signals done.
func (c *call) finish(charged func() []bool) {
	c.mu.Lock()
	if c.state == waiting {
		// The caller reads the result itself; if that fails (c.err, an
		// error in the reply), nothing was charged or the caller resolves
		// it from the reply.
		c.state, c.resolved = finished, true
		c.mu.Unlock()
		c.signal()
		return
	}
	c.resolved = true
	c.chargedBy = charged()
	late := c.late
	c.mu.Unlock()
	c.signal()
	if late != nil {
		late(c.chargedBy)
	}
}

// signal puts done's one token (a token rather than a close, so that the
// call and its channel can be used again: see releaseCall). A call is
// finished once.
func (c *call) signal() {
	select {
	case c.done <- struct{}{}:
	default:
		panic("redis: a call finished twice")
	}
}

// callPool holds calls of a standalone server's store for reuse (a call
// and its channel were two of a request's allocations).
var callPool sync.Pool

// releaseCall puts c back into the pool. Only a call whose caller read its
// result after the worker finished it (state finished, done's token
// taken) may be released: its worker touches it no more. A call whose
// caller left (abandoned) is never reused, as its worker resolves it
// later; neither is a Cluster's call.
func releaseCall(c *call) {
	g := &c.groupBuf[0]
	g.reply, g.err, g.slot = nil, nil, 0
	c.ctx, c.groups, c.err, c.until, c.timed = nil, nil, nil, time.Time{}, false
	c.taken, c.state, c.late, c.resolved, c.chargedBy = false, waiting, nil, false, nil
	callPool.Put(c)
}

// onLate registers what to do with the outcome of an abandoned call: at
// once if the worker has resolved it already, else when it does.
func (c *call) onLate(f func(charged []bool)) {
	c.mu.Lock()
	if !c.resolved {
		c.late = f
		c.mu.Unlock()
		return
	}
	charged := c.chargedBy
	c.mu.Unlock()
	f(charged)
}

// notCharged is the outcome of a call that was never sent.
func notCharged() []bool { return nil }

// chargedItems reports, per item of a call that ran, whether Redis charged
// it: usage accounting always, other items when their request's verdict
// committed and their own decision allowed. A group whose script call
// failed counts as not charged (it may have run and lost its reply: see
// Store.degrade).
func chargedItems(c *call) []bool {
	var charged []bool
	for gi := range c.groups {
		g := &c.groups[gi]
		if g.err != nil || g.refund || len(g.reply) != g.replyLen() {
			continue
		}
		for k, i := range g.idx {
			if g.items[k].bits&bitAccount != 0 || (g.reply[0] == 1 && g.reply[1+replyFields*k+replyAllowedHi]&1 == 1) {
				if charged == nil {
					charged = make([]bool, c.items)
				}
				charged[i] = true
			}
		}
	}
	return charged
}
