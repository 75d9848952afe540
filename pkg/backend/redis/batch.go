package redis

import (
	"context"
	"fmt"
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

	call  *scriptCall
	reply []int64 // the group's part of the call's reply
	err   error
}

// newCall splits items into groups: one on a standalone server, one per
// hash slot on a Cluster.
func (r *Store) newCall(ctx context.Context, items []backend.Item) *call {
	c := &call{ctx: ctx, now: nowArg(r.clock), whole: true, done: make(chan struct{}), items: len(items)}
	if !r.cluster {
		g := &c.groupBuf[0]
		if len(items) == 1 {
			g.idx, g.items = c.idxBuf[:], c.itemBuf[:]
		} else {
			g.idx, g.items = make([]int, len(items)), make([]item, len(items))
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
		g.slot = s
		for i := range items {
			if slots[i] == s {
				g.idx = append(g.idx, i)
				g.items = append(g.items, encodeItem(items, i, keys[i]))
			}
		}
	}
	return c
}

// collect forms batches of queued calls and hands each to a worker, as long
// as fewer than cap(sem) pipelines are in flight.
func (r *Store) collect() {
	defer r.wg.Done()
	var timer *time.Timer
	for {
		var first *call
		select {
		case first = <-r.queue:
		case <-r.stop:
			return
		}
		// Wait for a free connection; calls queue up meanwhile and join
		// this batch.
		select {
		case r.sem <- struct{}{}:
		case <-r.stop:
			r.unsent([]*call{first})
			return
		}
		batch := []*call{first}
		cmds := len(first.groups)
		if r.window > 0 && cmds < r.batchSize {
			if timer == nil {
				timer = time.NewTimer(r.window)
			} else {
				timer.Reset(r.window)
			}
		wait:
			for cmds < r.batchSize {
				select {
				case c := <-r.queue:
					batch = append(batch, c)
					cmds += len(c.groups)
				case <-timer.C:
					break wait
				case <-r.stop:
					<-r.sem
					r.unsent(batch)
					return
				}
			}
			timer.Stop()
		}
	drain:
		for cmds < r.batchSize {
			select {
			case c := <-r.queue:
				batch = append(batch, c)
				cmds += len(c.groups)
			default:
				break drain
			}
		}
		select {
		case r.work <- batch:
		case <-r.stop:
			<-r.sem
			r.unsent(batch)
			return
		}
	}
}

// worker runs the batches collect hands it, releasing their pipeline
// slot after each. The store keeps one worker per pipeline slot, so a
// batch never waits for one, and their stacks, grown once, stay grown (a
// goroutine per batch spent about a tenth of the store's CPU growing its
// stack).
func (r *Store) worker() {
	defer r.wg.Done()
	for {
		select {
		case batch := <-r.work:
			r.run(batch)
			<-r.sem
		case <-r.stop:
			return
		}
	}
}

// run sends batch as one pipeline of script calls (see send), then
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
func (r *Store) run(batch []*call) {
	rtt := time.Duration(r.rtt.Load())
	now := time.Now()
	live := batch[:0]
	for _, c := range batch {
		err := c.ctx.Err()
		if d, ok := c.ctx.Deadline(); err == nil && ok && d.Sub(now) < rtt {
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
		live = append(live, c)
	}
	if len(live) == 0 {
		return
	}
	start := time.Now()
	if !r.send(context.Background(), live) {
		// A moving average of the round trips that worked: failed ones
		// (a frozen or dead server) say nothing about the next one.
		d := int64(time.Since(start))
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
// its reply or error. It reports whether any script call failed.
func (r *Store) send(ctx context.Context, live []*call) (failed bool) {
	var calls []*scriptCall
	if r.cluster {
		bySlot := map[int]*scriptCall{}
		for _, c := range live {
			for i := range c.groups {
				g := &c.groups[i]
				sc := bySlot[g.slot]
				if sc == nil {
					sc = newScriptCall(0, 0)
					bySlot[g.slot] = sc
					calls = append(calls, sc)
				}
				sc.add(g, c.now, c.whole)
			}
		}
	} else {
		items := 0
		for _, c := range live {
			items += len(c.groups[0].items)
		}
		sc := newScriptCall(len(live), items)
		for _, c := range live {
			sc.add(&c.groups[0], c.now, true)
		}
		calls = []*scriptCall{sc}
	}

	evalsha := r.evalOnly.Load()
	pipe := r.client.Pipeline()
	for _, sc := range calls {
		sc.cmd = sc.command(ctx, evalsha, false)
		_ = pipe.Process(ctx, sc.cmd)
	}
	_, _ = pipe.Exec(ctx) // errors are in the cmds
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
		pipe := r.client.Pipeline()
		for _, sc := range again {
			sc.cmd = sc.command(ctx, false, source)
			_ = pipe.Process(ctx, sc.cmd)
		}
		_, _ = pipe.Exec(ctx)
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
