package redis

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/envoyrls/envoy-rls/pkg/backend"
)

// group is the items of one request in one cluster slot (all of them on a
// standalone server). The groups of a batch that share a slot go into one
// script call.
type group struct {
	idx   []int  // indices of the items in the request
	items []item // the items, encoded
	slot  int
	// part: the group is one slot of a request split across slots, whose
	// reply ends with the state's at each item's charge wrote (-1: none);
	// refund: its items are refunds (see Store.refund).
	part, refund bool

	reply []int64 // the group's part of the call's reply
	err   error
}

// replyLen is the length of g's part of its script call's reply.
func (g *group) replyLen() int {
	n := 1 + replyFields*len(g.idx)
	if g.part {
		n += len(g.idx)
	}
	return n
}

// newCall splits items into groups: one on a standalone server, one per
// hash slot on a Cluster. A standalone server's call comes from the pool
// of calls (see releaseCall).
func (r *Store) newCall(ctx context.Context, until time.Time, items []backend.Item) *call {
	var c *call
	if !r.cluster {
		c, _ = callPool.Get().(*call)
	}
	if c == nil {
		c = &call{done: make(chan struct{}, 1)}
	}
	c.ctx, c.now, c.whole, c.items = ctx, nowArg(r.clock), true, len(items)
	c.until, c.timed = until, !until.IsZero()
	if d, ok := ctx.Deadline(); ok && (until.IsZero() || !d.After(until)) {
		c.until, c.timed = d, false
	}
	if !r.cluster {
		g := &c.groupBuf[0]
		switch n := len(items); {
		case n == 1:
			g.idx, g.items = c.idxBuf[:], c.itemBuf[:]
		case cap(g.idx) >= n && cap(g.items) >= n:
			g.idx, g.items = g.idx[:n], g.items[:n]
		default:
			g.idx, g.items = make([]int, n), make([]item, n)
		}
		for i := range items {
			g.idx[i] = i
			g.items[i] = encodeItem(items, i, redisKey(r.prefix, &items[i]))
		}
		c.groups = c.groupBuf[:]
		return c
	}
	keys := make([]string, len(items))
	slots := make([]int, len(items))
	var order []int // distinct slots in order of first appearance
	for i := range items {
		keys[i] = redisKey(r.prefix, &items[i])
		slots[i] = slot(keys[i])
		seen := false
		for _, s := range order {
			if s == slots[i] {
				seen = true
				break
			}
		}
		if !seen {
			order = append(order, slots[i])
		}
	}
	c.whole = len(order) == 1
	c.groups = make([]group, len(order))
	for gi, s := range order {
		g := &c.groups[gi]
		g.slot, g.part = s, !c.whole
		for i := range items {
			if slots[i] == s {
				g.idx = append(g.idx, i)
				g.items = append(g.items, encodeItem(items, i, keys[i]))
			}
		}
	}
	return c
}

// enqueue adds c to the calls waiting for a pipeline and, when a worker is
// idle, wakes one. Under load every worker is busy and takes the waiting
// calls itself when its pipeline returns, so a request costs no goroutine
// wake-up besides its own (a collector goroutine between the callers and
// the workers used to add one per batch, and a channel operation per
// request). It reports false when the store is closing.
func (r *Store) enqueue(c *call) bool {
	r.mu.Lock()
	if r.stopped {
		r.mu.Unlock()
		return false
	}
	r.pending = append(r.pending, c)
	r.pendingCmds += len(c.groups)
	wake := r.idle > 0
	if wake {
		r.idle--
	}
	full := r.window > 0 && r.pendingCmds >= r.batchSize
	r.mu.Unlock()
	if wake {
		r.wake <- struct{}{} // room for every worker: never blocks
	}
	if full {
		select {
		case r.full <- struct{}{}:
		default:
		}
	}
	return true
}

// unqueue takes c back from the waiting calls, for a caller that leaves
// before its deadline: it reports false when a worker has taken c already
// (c is then in a pipeline, or about to be).
func (r *Store) unqueue(c *call) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c.taken {
		return false
	}
	i := slices.Index(r.pending, c)
	if i < 0 {
		return false // resolved by Close
	}
	r.pending = slices.Delete(r.pending, i, i+1)
	r.pendingCmds -= len(c.groups)
	return true
}

// worker runs batches of the waiting calls, one pipeline at a time, until
// the store closes. When its pipeline returns it takes the calls that
// arrived meanwhile (up to BatchSize script calls) and sends them at once,
// so batches grow with the load; it sleeps only when no call waits. The
// store keeps one worker per pipeline in flight (Options.Pipelines), for
// the store's life, so their stacks, grown once, stay grown (a goroutine
// per batch spent about a tenth of the store's CPU growing its stack).
func (r *Store) worker() {
	defer r.wg.Done()
	var batch []*call
	var timer *time.Timer
	sc := newScriptCall(0, 0) // reused batch after batch (standalone)
	for {
		r.mu.Lock()
		for len(r.pending) == 0 {
			if r.stopped {
				r.mu.Unlock()
				return
			}
			r.idle++
			r.mu.Unlock()
			select {
			case <-r.wake: // enqueue counted this worker out of idle
			case <-r.stop:
				return
			}
			r.mu.Lock()
		}
		r.mu.Unlock()
		// A pipeline slot (a write-back flush may hold one); calls that
		// arrive meanwhile join this batch.
		select {
		case r.sem <- struct{}{}:
		case <-r.stop:
			return
		}
		if r.window > 0 {
			select {
			case <-r.full: // left from an earlier batch
			default:
			}
			r.mu.Lock()
			short := r.pendingCmds < r.batchSize
			r.mu.Unlock()
			if short {
				if timer == nil {
					timer = time.NewTimer(r.window)
				} else {
					timer.Reset(r.window)
				}
				select {
				case <-timer.C:
				case <-r.full:
					timer.Stop()
				case <-r.stop:
					<-r.sem
					return
				}
			}
		}
		batch = r.take(batch[:0])
		if len(batch) > 0 {
			r.run(batch, sc)
			clear(batch) // the calls are done: keep no references
		}
		<-r.sem
		select {
		case <-r.stop:
			// The calls still waiting are resolved by Close.
			return
		default:
		}
	}
}

// take appends to batch the oldest waiting calls, up to BatchSize script
// calls (at least one call), and wakes an idle worker for the rest.
func (r *Store) take(batch []*call) []*call {
	r.mu.Lock()
	defer r.mu.Unlock()
	n, cmds := 0, 0
	for n < len(r.pending) && cmds < r.batchSize {
		cmds += len(r.pending[n].groups)
		n++
	}
	for _, c := range r.pending[:n] {
		c.taken = true
	}
	batch = append(batch, r.pending[:n]...)
	m := copy(r.pending, r.pending[n:])
	clear(r.pending[m:])
	r.pending = r.pending[:m]
	r.pendingCmds -= cmds
	if m > 0 && r.idle > 0 {
		r.idle--
		r.wake <- struct{}{}
	}
	return batch
}

// run sends batch as one pipeline of script calls (see send; sc is the
// worker's script call to reuse), then
// releases the callers. Calls whose context has ended, or whose deadline is
// nearer than a round trip takes (the recent successful round trips'
// average), are not sent: they could not be answered in time, and a call
// that is not sent is known not to have charged anything.
//
// The pipeline has no deadline of its callers: a caller that leaves at its
// deadline must not cut the pipeline short for the others, nor break its
// connection, which would then be closed and dialled again (a reconnect
// storm under load). The pipeline is bounded by the client's read and write
// timeouts instead, and the calls whose callers left are resolved from
// their late replies.
func (r *Store) run(batch []*call, sc *scriptCall) {
	rtt := time.Duration(r.rtt.Load())
	now := time.Now()
	live := batch[:0]
	for _, c := range batch {
		err := c.ctx.Err()
		if err == nil && !c.until.IsZero() && !now.Before(c.until) {
			err = context.DeadlineExceeded
		}
		if err == nil && !c.until.IsZero() && c.until.Sub(now) < rtt {
			err = fmt.Errorf("redis: not sent, the deadline is nearer than a round trip (%v): %w", rtt, context.DeadlineExceeded)
			// Lower the estimate a little at each call it keeps out, so
			// that one slow spell cannot keep every call out for good.
			r.rtt.CompareAndSwap(int64(rtt), int64(rtt-rtt/8))
		}
		if err != nil {
			r.notSent.Add(1)
			c.err = err
			c.finish(notCharged)
			continue
		}
		if n := r.nodeDown(c); n != nil {
			// Its node went down while it waited.
			r.health.downCalls.Add(1)
			c.err = n.downErr()
			c.finish(notCharged)
			continue
		}
		live = append(live, c)
	}
	if len(live) == 0 {
		return
	}
	start := time.Now()
	if !r.send(context.Background(), live, sc) {
		// A moving average of the round trips that worked: failed ones
		// (a frozen or dead server) say nothing about the next one.
		d := int64(time.Since(start))
		if r.health != nil {
			r.health.noteRoundTrip(time.Duration(d))
		}
		for {
			old := r.rtt.Load()
			if r.rtt.CompareAndSwap(old, old+(d-old)/8) {
				break
			}
		}
	}
	for _, c := range live {
		c.finish(func() []bool { return chargedItems(c) })
	}
}

// send sends calls as one pipeline of script calls, one per slot (one in
// all on a standalone server), and re-sends the script calls that did not
// run because the server lacked the function or script. Each group gets
// its reply or error. It reports whether any script call failed. On a
// standalone server the one script call is buf when it is not nil (a
// worker's, reused: it is reset here).
func (r *Store) send(ctx context.Context, live []*call, buf *scriptCall) (failed bool) {
	var calls []*scriptCall
	if r.cluster {
		// Refunds go in script calls of their own (see Store.refund), in
		// the same pipeline.
		bySlot := map[int]*scriptCall{}
		for _, c := range live {
			for i := range c.groups {
				g := &c.groups[i]
				k := g.slot
				if g.refund {
					k += clusterSlots
				}
				sc := bySlot[k]
				if sc == nil {
					sc = newScriptCall(0, 0)
					bySlot[k] = sc
					calls = append(calls, sc)
				}
				sc.add(g, c.now, c.whole)
			}
		}
	} else {
		sc := buf
		if sc != nil {
			sc.reset()
		} else {
			items := 0
			for _, c := range live {
				items += len(c.groups[0].items)
			}
			sc = newScriptCall(len(live), items)
		}
		for _, c := range live {
			sc.add(&c.groups[0], c.now, true)
		}
		calls = []*scriptCall{sc}
	}

	evalsha := r.evalOnly.Load()
	for _, sc := range calls {
		sc.cmd = sc.command(ctx, evalsha, false)
	}
	if h := r.health; h != nil && !r.cluster {
		h.one.begin()
		defer func() { h.one.end(firstErr(calls)) }()
	} else if h != nil {
		nodes := r.clusterNodes(calls)
		for _, n := range nodes {
			if n != nil {
				n.begin()
			}
		}
		defer func() {
			for i, n := range nodes {
				if n != nil {
					n.end(calls[i].cmd.Err())
				}
			}
		}()
	}
	r.exec(ctx, calls)
	r.roundTrips.Add(1)
	r.scriptCalls.Add(uint64(len(calls)))

	// Calls that did not run: the server lacks the function (a restart,
	// FUNCTION FLUSH, the first call) or the script (NOSCRIPT), or has no
	// functions at all (Redis before 7.0). Nothing ran, so sending them
	// again cannot charge twice.
	var again []*scriptCall
	for _, sc := range calls {
		if notRun(sc.cmd.Err()) {
			again = append(again, sc)
		}
	}
	if len(again) > 0 {
		source := true // EVAL: runs the script and caches it for EVALSHA
		if !evalsha {
			if err := r.loadLibrary(ctx); err == nil {
				source = false
			} else {
				// No functions here (or not allowed): scripts from now on.
				r.evalOnly.Store(true)
			}
		}
		for _, sc := range again {
			sc.cmd = sc.command(ctx, false, source)
		}
		r.exec(ctx, again)
		r.roundTrips.Add(1)
		r.scriptCalls.Add(uint64(len(again)))
		r.reloads.Add(1)
	}
	for _, sc := range calls {
		sc.decode()
		if err := sc.cmd.Err(); err != nil {
			failed = true
			if isOOM(err) {
				r.oom.Add(1)
			}
		}
	}
	return failed
}

// firstErr returns the first error of the script calls.
func firstErr(calls []*scriptCall) error {
	for _, sc := range calls {
		if err := sc.cmd.Err(); err != nil {
			return err
		}
	}
	return nil
}

// clusterNodes returns the node of each script call of a Cluster (nil:
// not known), for the stall check (see health).
func (r *Store) clusterNodes(calls []*scriptCall) []*nodeHealth {
	h := r.health
	nodes := make([]*nodeHealth, len(calls))
	for i, sc := range calls {
		if len(sc.keys) > 0 {
			nodes[i] = h.slotNode(sc.keys[0])
		}
	}
	return nodes
}

// exec sends the script calls in one round trip; their errors are in
// their commands. One call on a standalone or Sentinel server (every batch
// there) is sent as a plain command: go-redis's pipeline machinery costs
// more for one command. A Cluster's calls go in a pipeline, which reaches
// each slot's node.
func (r *Store) exec(ctx context.Context, calls []*scriptCall) {
	if len(calls) == 1 && !r.cluster {
		_ = r.client.Process(ctx, calls[0].cmd)
		return
	}
	pipe := r.client.Pipeline()
	for _, sc := range calls {
		_ = pipe.Process(ctx, sc.cmd)
	}
	_, _ = pipe.Exec(ctx)
}

// notRun reports whether err says that a script call was refused before it
// ran: the function or script is unknown, or FCALL itself is, or the user
// may not call it (an ACL without FUNCTION or FCALL: scripts from then on).
func notRun(err error) bool {
	if err == nil {
		return false
	}
	return goredis.HasErrorPrefix(err, "NOSCRIPT") || goredis.HasErrorPrefix(err, "NOPERM") ||
		goredis.HasErrorPrefix(err, "Function not found") || goredis.HasErrorPrefix(err, "unknown command")
}

// loadLibrary loads the function library on the server, or on every master
// of a Cluster. A library that is already there is fine.
func (r *Store) loadLibrary(ctx context.Context) error {
	load := func(ctx context.Context, c goredis.Cmdable) error {
		err := c.FunctionLoad(ctx, libraryCode).Err()
		if err != nil && strings.Contains(err.Error(), "already exists") {
			return nil
		}
		return err
	}
	if cc, ok := r.client.(*goredis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, c *goredis.Client) error { return load(ctx, c) })
	}
	return load(ctx, r.client)
}
