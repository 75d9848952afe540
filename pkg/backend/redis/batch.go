package redis

import (
	"context"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/envoyrls/envoy-rls/pkg/backend"
)

// call is one Apply waiting for its script calls. The worker that runs it
// touches only the call's own fields, never the caller's items or out, so
// a caller may leave at its deadline while the call is in flight.
type call struct {
	ctx    context.Context
	now    string // ARGV's now
	whole  bool   // false: the request is split across Cluster slots
	groups []group
	err    error         // set before done is closed when the call was not sent
	done   chan struct{} // closed when every group has its result
}

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
	c := &call{ctx: ctx, now: nowArg(r.clock), whole: true, done: make(chan struct{})}
	if !r.cluster {
		g := group{idx: make([]int, len(items)), items: make([]item, len(items))}
		for i := range items {
			g.idx[i] = i
			g.items[i] = encodeItem(items, i, redisKey(r.prefix, &items[i]))
		}
		c.groups = []group{g}
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
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			defer func() { <-r.sem }()
			r.run(batch)
		}()
	}
}

// run sends batch as one pipeline of script calls, one per slot (one in
// all on a standalone server), re-sends the calls that did not run because
// the server lacked the function or script, then releases the callers.
// Calls whose context has ended are not sent.
func (r *Store) run(batch []*call) {
	live := batch[:0]
	for _, c := range batch {
		if err := c.ctx.Err(); err != nil {
			c.err = err
			close(c.done) // its caller has left or is leaving
			continue
		}
		live = append(live, c)
	}
	if len(live) == 0 {
		return
	}
	ctx, cancel := batchContext(live)
	defer cancel()

	var calls []*scriptCall
	if r.cluster {
		bySlot := map[int]*scriptCall{}
		for _, c := range live {
			for i := range c.groups {
				g := &c.groups[i]
				sc := bySlot[g.slot]
				if sc == nil {
					sc = newScriptCall()
					bySlot[g.slot] = sc
					calls = append(calls, sc)
				}
				sc.add(g, c.now, c.whole)
			}
		}
	} else {
		sc := newScriptCall()
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
	}
	for _, c := range live {
		close(c.done)
	}
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

// batchContext returns a context for a pipeline that ends at the latest
// deadline of the calls, or has none when one of them has none (go-redis's
// timeouts bound it then). It is not cancelled by the calls' contexts: a
// call sent must not cut the pipeline short for the others.
func batchContext(calls []*call) (context.Context, context.CancelFunc) {
	var latest time.Time
	for _, c := range calls {
		d, ok := c.ctx.Deadline()
		if !ok {
			return context.WithCancel(context.Background())
		}
		if d.After(latest) {
			latest = d
		}
	}
	return context.WithDeadline(context.Background(), latest)
}
