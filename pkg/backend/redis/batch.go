package redis

import (
	"context"
	"strconv"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/envoyrls/envoy-rls/pkg/backend"
)

// call is one Apply waiting for its script calls. The worker that runs it
// touches only the call's own fields, never the caller's items or out, so
// a caller may leave at its deadline while the call is in flight.
type call struct {
	ctx    context.Context
	now    string // ARGV[argNow]
	whole  string // ARGV[argWhole]
	groups []group
	err    error         // set before done is closed when the call was not sent
	done   chan struct{} // closed when every group's cmd has its result
}

// group is the items of one request in one cluster slot (all of them on a
// standalone server): one script call.
type group struct {
	idx  []int    // indices of the items in the request
	keys []string // distinct Redis keys (KEYS)
	args string   // ARGV[argItems]
	cmd  *goredis.Cmd
}

// newCall splits items into script calls: one on a standalone server, one
// per hash slot on a Cluster.
func (r *Store) newCall(ctx context.Context, items []backend.Item) *call {
	c := &call{ctx: ctx, whole: wholeRequest, done: make(chan struct{})}
	if r.clock != nil {
		c.now = strconv.FormatInt(max(r.clock.Now().UnixMicro(), 0), 10)
	}
	keys := make([]string, len(items))
	for i := range items {
		keys[i] = redisKey(r.prefix, &items[i])
	}
	if !r.cluster {
		idx := make([]int, len(items))
		for i := range idx {
			idx[i] = i
		}
		c.groups = []group{makeGroup(items, keys, idx)}
		return c
	}
	slots := make([]int, len(items))
	var order []int // distinct slots in order of first appearance
	for i, k := range keys {
		slots[i] = slot(k)
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
	if len(order) > 1 {
		c.whole = partOfRequest
	}
	c.groups = make([]group, len(order))
	for gi, s := range order {
		var idx []int
		for i := range items {
			if slots[i] == s {
				idx = append(idx, i)
			}
		}
		c.groups[gi] = makeGroup(items, keys, idx)
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

// run sends the script calls of batch in one pipeline (and the ones that
// met NOSCRIPT again with EVAL), then releases their callers. Calls whose
// context has ended are not sent.
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

	sha := applyScript.Hash()
	pipe := r.client.Pipeline()
	n := 0
	for _, c := range live {
		for i := range c.groups {
			g := &c.groups[i]
			g.cmd = pipe.EvalSha(ctx, sha, g.keys, argv(c.now, c.whole, g.args)...)
			n++
		}
	}
	_, _ = pipe.Exec(ctx) // errors are in the cmds
	r.roundTrips.Add(1)
	r.scriptCalls.Add(uint64(n))

	var again goredis.Pipeliner
	n = 0
	for _, c := range live {
		for i := range c.groups {
			g := &c.groups[i]
			if !goredis.HasErrorPrefix(g.cmd.Err(), "NOSCRIPT") {
				continue
			}
			// The script did not run: send it with its source, which also
			// caches it on the server for the next EVALSHA.
			if again == nil {
				again = r.client.Pipeline()
			}
			g.cmd = again.Eval(ctx, applyLua, g.keys, argv(c.now, c.whole, g.args)...)
			n++
		}
	}
	if again != nil {
		_, _ = again.Exec(ctx)
		r.roundTrips.Add(1)
		r.scriptCalls.Add(uint64(n))
		r.reloads.Add(1)
	}
	for _, c := range live {
		close(c.done)
	}
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
