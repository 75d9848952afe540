package redis

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/backend"
)

// Defaults of the degraded mode.
const (
	// DefaultWriteBackKeys bounds the keys waiting to be written back when
	// Options.WriteBackKeys is zero.
	DefaultWriteBackKeys = 100_000
	// WriteBackInterval is how often waiting write-backs are sent.
	WriteBackInterval = 50 * time.Millisecond
)

// initDegraded checks and applies the degraded-mode options.
func (r *Store) initDegraded(opts Options) error {
	if opts.FallbackShare < 0 || opts.FallbackShare > 1 || math.IsNaN(opts.FallbackShare) {
		return fmt.Errorf("redis: fallback share %v is not in (0, 1]", opts.FallbackShare)
	}
	if opts.WriteBackKeys < 0 {
		return errors.New("redis: write-back keys must not be negative")
	}
	r.fallback = opts.Fallback
	r.onFallback = opts.OnFallback
	r.share = opts.FallbackShare
	if r.share == 0 {
		r.share = 1
	}
	r.countFailedOpen = opts.CountFailedOpen
	max := opts.WriteBackKeys
	if max == 0 {
		max = DefaultWriteBackKeys
	}
	r.wb = &writeBack{max: max, keys: map[string]*backend.Item{}}
	r.closeWriteBack = opts.CloseWriteBack
	if r.closeWriteBack == 0 {
		r.closeWriteBack = DefaultCloseWriteBack
	}
	return nil
}

// degrade answers a request that Redis did not decide (err: its deadline
// came first, Redis failed, or the reply was unusable), following the
// degraded-mode options:
//
//   - With a Fallback store, the request is decided there, on each limit
//     scaled by FallbackShare, and the hits it allows are written back to
//     Redis later as usage accounting (see writeBack), unless Redis turns
//     out to have charged them already: a call sent before its caller left
//     may still run, and its late reply says what it charged. Nothing
//     allowed goes uncounted.
//   - With CountFailedOpen (the caller answers OK: failure mode allow), the
//     hits of every item are written back the same way.
//   - Otherwise the error is returned (the caller answers UNAVAILABLE or
//     fails open uncounted).
//
// The same holds when ctx was done before the call was sent (it charged
// nothing then), whether its deadline passed or it was cancelled. A
// deadline means the caller's budget is spent while the caller still waits
// for the failure mode's answer. A cancellation means the caller left and
// no answer reaches anyone; its allowed hits are counted all the same, on
// the side of denying: Envoy resets its call when its own timeout fires and
// then, with failure_mode_deny false, lets the request through, so a
// departed client cannot be told from a request that passed.
//
// A request answered by the failure policy or denied by the fallback may
// still be charged by Redis, when it was sent before its caller left and
// the script ran: LateCharged counts them, and LateUnsure those whose
// pipeline failed in a way that may have let it run (its reply, which
// would tell, is lost). At most the calls in flight
// when their callers' deadlines passed can be so charged: no more than
// the pipelines in flight times the batch size at any instant.
func (r *Store) degrade(c *call, items []backend.Item, out []algorithms.Decision, err error) (bool, error) {
	if errors.Is(err, backend.ErrClosed) {
		r.errs.Add(1)
		return false, err
	}
	var allowed bool
	var count []backend.Item // what the answer allowed: to be counted in Redis
	var idx []int            // their indices in items
	switch {
	case r.fallback != nil:
		local := make([]backend.Item, len(items))
		for i, it := range items {
			it.Limit = scaleLimit(it.Limit, r.share)
			local[i] = it
		}
		var ferr error
		allowed, ferr = r.fallback.Apply(context.Background(), local, out)
		if ferr != nil {
			r.errs.Add(1)
			return false, fmt.Errorf("%w (fallback: %v)", err, ferr)
		}
		r.localDecisions.Add(1)
		if r.onFallback != nil {
			r.onFallback(err)
		}
		// What the fallback charged goes to Redis later: the hits of an
		// allowed request's allowing items, and usage accounting whatever
		// the verdict (the fallback charged it even when it did not fit).
		for i, it := range items {
			if it.Hits > 0 && (it.Account || (allowed && out[i].Allowed)) {
				count, idx = append(count, it), append(idx, i)
			}
		}
	case r.countFailedOpen:
		r.errs.Add(1)
		for i, it := range items {
			if it.Hits > 0 {
				count, idx = append(count, it), append(idx, i)
			}
		}
	default:
		r.errs.Add(1)
	}
	c.onLate(func(charged []bool) {
		if len(count) == 0 {
			if charged != nil {
				r.lateCharged.Add(1)
			} else if c.unsure() {
				r.lateUnsure.Add(1)
			}
			return
		}
		unsure := c.unsure()
		for k, it := range count {
			if charged == nil || !charged[idx[k]] {
				if unsure {
					r.wb.unsure.Add(it.Hits)
				}
				r.wb.add(it)
			}
		}
	})
	if r.fallback != nil {
		return allowed, nil
	}
	return false, err
}

// scaleLimit returns l with its requests and burst scaled by share, each
// at least 1 when it was positive.
func scaleLimit(l algorithms.Limit, share float64) algorithms.Limit {
	if share >= 1 {
		return l
	}
	scale := func(n uint64) uint64 {
		if n == 0 {
			return 0
		}
		return max(uint64(math.Ceil(float64(n)*share)), 1)
	}
	l.Requests = scale(l.Requests)
	l.Burst = scale(l.Burst)
	return l
}

// writeBack holds hits allowed without Redis, per key, until they are
// charged to Redis. A write-back is usage accounting (backend.Item.Account,
// the mechanism of Envoy's reported costs): hits that already happened,
// charged whatever the key's state, past its limit or as debt when they do
// not fit (algorithms.Account), so that Redis's count includes every hit
// answered OK. It is bounded by max keys: hits of further keys are dropped
// and counted.
type writeBack struct {
	mu   sync.Mutex
	max  int
	keys map[string]*backend.Item // hits accumulate per key
	// inflight counts the keys taken for a flush whose outcome is not
	// known yet: they are pending until written or put back, so that
	// "nothing pending" means every hit taken is charged.
	inflight int

	// written counts the hits charged; overLimit those of them whose
	// write-back did not fit whole in its limit; dropped those lost to a
	// full buffer; retried the hits sent again after a failure that may
	// have let the first send run, and unsure those of calls whose
	// pipeline failed that way (so either may be counted twice).
	written, overLimit, dropped, retried, unsure atomic.Uint64
	// droppedAtClose counts the hits still waiting when Close gave up.
	droppedAtClose atomic.Uint64
}

func (w *writeBack) add(it backend.Item) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if e, ok := w.keys[it.Key]; ok {
		e.Hits += it.Hits
		e.Limit = it.Limit // the latest limit (a reload may change it)
		return
	}
	if len(w.keys) >= w.max {
		w.dropped.Add(it.Hits)
		return
	}
	it.Mode, it.Group, it.Account = backend.Enforced, 0, true
	w.keys[it.Key] = &it
}

// pending returns the keys whose hits wait to be written back or are
// being written (taken by a flush not settled yet).
func (w *writeBack) pending() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.keys) + w.inflight
}

// take removes up to n waiting items; they stay pending until settled.
func (w *writeBack) take(n int) []backend.Item {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []backend.Item
	for k, it := range w.keys {
		if len(out) == n {
			break
		}
		out = append(out, *it)
		delete(w.keys, k)
	}
	w.inflight += len(out)
	return out
}

// settled ends the flight of n items taken: each was written or put back
// (add) before.
func (w *writeBack) settled(n int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.inflight -= n
}

// flushLoop writes waiting hits back to Redis every WriteBackInterval.
func (r *Store) flushLoop() {
	defer r.wg.Done()
	t := time.NewTicker(WriteBackInterval)
	defer t.Stop()
	// ctx ends when the store closes: a PING or a wait for a pipeline slot
	// stops then (Close writes back what is left, see drain).
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-r.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
			for r.flush(ctx, context.Background()) {
			}
		}
	}
}

// flush sends one pipeline of waiting write-backs, one script call per key
// accounting its hits (backend.Item.Account): they are charged whether or
// not they fit, and those of a write-back that did not fit whole are
// counted in WriteBackOverLimit (the key was charged past its limit, or
// into debt; a full sliding window log keeps no more than its limit).
//
// Write-backs are sent only once Redis answers a PING, and no node is down
// (see health; at Close, whose watcher has stopped, the PING alone): a
// write-back sent to
// a frozen server times out but may run when the server resumes, and sending
// it again at every flush of an outage would charge it many times. On an
// error the items wait for the next flush; when the error leaves open
// whether the script ran (it was written to a connection: a timeout, a
// connection reset), their hits are counted in WriteBackRetried, as they
// may be charged twice (the error is on the side of denying). It reports
// whether it sent a full pipeline and more may wait.
//
// ctx bounds the PING and the wait for a pipeline slot; sendCtx the
// pipeline itself (the flush loop's pipeline is bounded by the client's
// timeouts alone, like every pipeline: see run).
func (r *Store) flush(ctx, sendCtx context.Context) bool {
	// Once the store is closing the watcher has stopped and a node down
	// stays marked down: the PING alone then says whether Redis answers.
	if r.wb.pending() == 0 || (r.health != nil && r.health.down.Load() > 0 && !r.closed.Load()) || !r.answers(ctx) {
		return false
	}
	// A pipeline slot like any other, so the connections stay within the
	// pipelines in flight.
	select {
	case r.sem <- struct{}{}:
	case <-ctx.Done():
		return false
	}
	defer func() { <-r.sem }()
	items := r.wb.take(r.batchSize)
	if len(items) == 0 {
		return false
	}
	defer r.wb.settled(len(items)) // after the failed ones are put back
	calls := make([]*call, len(items))
	for i := range items {
		calls[i] = r.newCall(context.Background(), time.Time{}, items[i:i+1])
	}
	r.send(sendCtx, calls, nil)
	out := make([]algorithms.Decision, 1)
	failed := false
	for i, c := range calls {
		it := items[i]
		// Each its own: on a Cluster, the script calls of other slots
		// may have worked.
		if err := decodeGroup(&c.groups[0], items[i:i+1], out); err != nil {
			failed = true
			if mayHaveRun(err) {
				r.wb.retried.Add(it.Hits)
			}
			r.wb.add(it)
			continue
		}
		r.wb.written.Add(it.Hits)
		if !out[0].Allowed {
			r.wb.overLimit.Add(it.Hits)
		}
	}
	return !failed && len(items) == r.batchSize
}

// answers reports whether Redis answers a PING (within the client's read
// timeout, or until ctx ends): on a Cluster, every master, as a write-back
// may be for any of them.
func (r *Store) answers(ctx context.Context) bool {
	if cc, ok := r.client.(*goredis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, c *goredis.Client) error { return c.Ping(ctx).Err() }) == nil
	}
	return r.client.Ping(ctx).Err() == nil
}

// mayHaveRun reports whether a script call that failed with err may still
// have run: anything but a failure to connect, or a refusal before running
// (then the command was never written, or never executed).
func mayHaveRun(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return false
	}
	return !errors.Is(err, goredis.ErrPoolTimeout) && !errors.Is(err, goredis.ErrClosed) && !notRun(err) && !isOOM(err)
}

// unsure reports whether a resolved call failed in a way that may have let
// Redis run it all the same (see mayHaveRun): its hits are then written
// back although Redis may have charged them.
func (c *call) unsure() bool {
	for i := range c.groups {
		if err := c.groups[i].err; err != nil && mayHaveRun(err) {
			return true
		}
	}
	return false
}

// isOOM reports an error of a Redis at maxmemory that refuses writes.
func isOOM(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "OOM ")
}
