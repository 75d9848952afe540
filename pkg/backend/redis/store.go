// Package redis is the backend.Store backed by Redis (standalone, Sentinel
// or Cluster) through go-redis: one Lua script call (lua/*.lua, the twin
// of pkg/algorithms) decides a request's items, concurrent requests share
// pipelines, and an optional local deny cache answers repeated denials
// without a round trip.
package redis

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/maypok86/otter/v2"
	goredis "github.com/redis/go-redis/v9"

	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/backend"
)

// Redis is the Store backed by Redis: standalone, Sentinel or Cluster,
// through go-redis. Each request's items are decided by one Lua script call
// (lua/*.lua, the twin of pkg/algorithms) that takes now from Redis's TIME,
// so every instance sharing a Redis agrees on time and on counts. Concurrent
// requests share pipelines (see Options.BatchWindow), so a request
// costs at most one round trip, and less under load.
//
// All or nothing: on a standalone or Sentinel server, and on a Cluster when
// all of a request's keys share one hash slot, the script decides every item
// and charges nothing when the request is denied, exactly like the memory
// store. The store alone derives the keys' hash tags, from the items'
// Partition (see backend.Item): the items of one partition always share a
// slot.
//
// A request whose keys fall into several Cluster slots is split into one
// script call per slot, each atomic on its own node and all sent in the same
// pipeline. No call sees the others' decisions, so each charges its allowing
// items unless one of its own Enforced items denies. Then:
//   - when the request is allowed, every item whose decision allows is
//     charged, exactly as on one slot: the limits are never exceeded (the
//     store stays exact);
//   - when the request is denied, the admission charges of the slots that
//     charged are taken back by a refund (see refund): one more round trip,
//     for denied split requests only. The refund takes back exactly what
//     the charge added (for token_bucket and gcra, when another request
//     wrote the key between the charge and the refund, it may keep up to
//     what the limit refills in between: a fraction of a token when the
//     refund follows within a round trip), so one user's denied requests
//     leave the limits they share with others as they were. Usage
//     accounting is never refunded. Until the refund lands, other requests
//     see the charge; a refund that cannot be made (RefundsFailed) leaves
//     it.
//
// Failures: New does not connect; go-redis connects lazily and
// reconnects by itself, so a Redis that is down at start-up or restarts
// later only makes the calls in between fail. Apply returns as soon as ctx
// is done, whatever Redis does, and the degraded mode (Options.Fallback,
// Options.CountFailedOpen) decides then, even when ctx was done before the
// call: see Store.degrade.
type Store struct {
	client  goredis.UniversalClient
	cluster bool
	prefix  string
	clock   backend.Clock // nil: Redis's TIME

	window    time.Duration
	batchSize int
	sem       chan struct{} // one token per pipeline in flight

	// The calls waiting for a pipeline (see enqueue and worker).
	mu          sync.Mutex
	pending     []*call
	pendingCmds int           // their script calls (groups)
	idle        int           // workers waiting for wake
	stopped     bool          // Close resolved the pending calls: refuse more
	wake        chan struct{} // one token per idle worker to wake
	full        chan struct{} // BatchWindow: pendingCmds reached batchSize

	deny      *otter.Cache[string, denial] // nil when disabled
	denyClock backend.Clock

	closed    atomic.Bool
	closeOnce sync.Once
	stop      chan struct{}
	wg        sync.WaitGroup

	requests, roundTrips, scriptCalls atomic.Uint64
	localDenials, errs, reloads       atomic.Uint64
	decided, notSent, oom             atomic.Uint64
	refunds, refundsFailed            atomic.Uint64
	rtt                               atomic.Int64 // ns, moving average of successful round trips

	// Degraded mode: see degrade.go.
	fallback        backend.Store // nil: none (Options.Fallback)
	onFallback      func(error)   // nil: none (Options.OnFallback)
	share           float64
	countFailedOpen bool
	wb              *writeBack
	closeWriteBack  time.Duration
	localDecisions  atomic.Uint64
	lateCharged     atomic.Uint64
	lateUnsure      atomic.Uint64

	// health notices a stalled or dead node (see stall.go); nil when
	// Options.StallTimeout is negative.
	health *health

	// evalOnly is set once the server turned out to have no functions
	// (Redis before 7.0, or FUNCTION not allowed): EVALSHA from then on.
	evalOnly atomic.Bool
	watch    *limitsWatch

	// The local paths of consistencies lease and approximate (see
	// consistency.go); nil: their items are decided strict.
	lease, approx               localPath
	chunkDecided, approxDecided atomic.Uint64 // requests decided without Redis by them
}

// ServerLimits returns the memory limit and policy each server reported on
// the last connection made to it (none before the first connection).
func (r *Store) ServerLimits() []ServerLimits { return r.watch.limits() }

var _ backend.Store = (*Store)(nil)

// New returns a Redis store for opts. It checks the options but does
// not connect: it succeeds while Redis is down. Call Close to release it.
func New(opts Options) (*Store, error) { return newStore(opts, nil) }

// newStore is New with a clock for tests: when clock is nil (production),
// the script takes now from Redis's own TIME, so instances with skewed
// clocks agree. When set, Apply reads it once and passes now to the script,
// so a test can drive Redis along a timeline (see export_test.go); the deny
// cache then reads it too. State keys then get their TTLs from the same
// code, an hour longer (the script's TEST_TTL_SLACK_MS): a TTL counts real
// time, and a test's clock may stand still while real milliseconds pass,
// so exact TTLs would expire states the test still counts on (a model
// comparison with 1 ms windows fails within a few hundred steps).
func newStore(opts Options, clock backend.Clock) (*Store, error) {
	if strings.ContainsAny(opts.KeyPrefix, "{}") {
		return nil, fmt.Errorf("redis: key prefix %q must not contain '{' or '}'", opts.KeyPrefix)
	}
	if opts.BatchSize < 0 || opts.PoolSize < 0 || opts.LocalDenyCacheSize < 0 {
		return nil, errors.New("redis: batch size, pool size and deny cache size must not be negative")
	}
	if opts.BatchWindow < 0 {
		return nil, errors.New("redis: batch window must not be negative")
	}
	watch := &limitsWatch{notify: opts.OnServerLimits, last: map[string]ServerLimits{}}
	var h *health
	if opts.StallTimeout >= 0 {
		stall := opts.StallTimeout
		if stall == 0 {
			stall = DefaultStallTimeout
		}
		h = newHealth(stall, opts.OnNodeHealth)
	}
	client, cluster, poolSize, err := newClient(opts, watch.onConnect, h)
	if err != nil {
		return nil, err
	}
	if h != nil {
		h.cluster, _ = client.(*goredis.ClusterClient)
	}
	r := &Store{
		client:    client,
		cluster:   cluster,
		prefix:    opts.KeyPrefix,
		clock:     clock,
		window:    opts.BatchWindow,
		batchSize: opts.BatchSize,
		stop:      make(chan struct{}),
		watch:     watch,
		health:    h,
	}
	if r.batchSize == 0 {
		r.batchSize = DefaultBatchSize
	}
	if poolSize == 0 {
		poolSize = 10 * runtime.GOMAXPROCS(0) // go-redis's default pool size
	}
	workers := opts.Pipelines
	if workers == 0 {
		workers = DefaultPipelines
	}
	workers = min(workers, poolSize)
	r.sem = make(chan struct{}, workers)
	r.wake = make(chan struct{}, workers)
	r.full = make(chan struct{}, 1)
	if err := r.initDegraded(opts); err != nil {
		client.Close()
		return nil, err
	}
	if r.lease, err = r.newLease(opts); err != nil {
		client.Close()
		return nil, err
	}
	if r.approx, err = r.newApproximate(opts); err != nil {
		client.Close()
		return nil, err
	}
	if lp, ok := r.lease.(*leasePath); ok {
		if ap, ok := r.approx.(*approxPath); ok {
			// Approximate keys take lease chunks while plenty remains.
			ap.lease, lp.approxHold = lp, ap.hold
		}
	}
	if opts.LocalDenyCache {
		size := opts.LocalDenyCacheSize
		if size == 0 {
			size = DefaultLocalDenyCacheSize
		}
		r.denyClock = clock
		if r.denyClock == nil {
			r.denyClock = backend.MonotonicClock()
		}
		r.deny = otter.Must(&otter.Options[string, denial]{
			MaximumSize: size,
			ExpiryCalculator: otter.ExpiryWritingFunc(func(e otter.Entry[string, denial]) time.Duration {
				return e.Value.ttl
			}),
		})
	}
	if h != nil {
		h.pipelines = workers
		h.onDown = r.dropPending
		r.wg.Add(1)
		go h.watch(r.stop, &r.wg)
	}
	r.wg.Add(1 + workers)
	go r.flushLoop()
	for range workers {
		go r.worker()
	}
	return r, nil
}

// Stats are counters of a Redis store, for metrics.
type Stats struct {
	// Requests counts Apply calls with at least one item.
	Requests uint64
	// RoundTrips counts pipelines sent. On a Cluster one pipeline reaches
	// the nodes of its calls in parallel and counts once.
	RoundTrips uint64
	// ScriptCalls counts script calls (FCALL, or EVALSHA/EVAL on a server
	// without functions): one per pipeline, or one per slot of a pipeline on
	// a Cluster, however many requests it holds.
	ScriptCalls uint64
	// LocalDenials counts requests denied by the local deny cache without
	// a Redis call.
	LocalDenials uint64
	// Errors counts Apply calls that returned an error, including those
	// whose context ended first.
	Errors uint64
	// ScriptReloads counts pipelines re-sent because the server did not have
	// the function library (loaded then) or the script (sent with EVAL):
	// the first pipeline, and after a restart or a flush.
	ScriptReloads uint64

	// Decided counts requests decided by Redis.
	Decided uint64
	// NotSent counts calls dropped before they were sent because their
	// deadline had passed or was nearer than a round trip: they charged
	// nothing.
	NotSent uint64
	// OOM counts script calls refused because Redis reached maxmemory
	// (an OOM error: the noeviction policy), apart from other errors.
	OOM uint64
	// Refunds counts denied requests split across Cluster slots whose
	// slots' admission charges were taken back (one more round trip each:
	// see Store); RefundsFailed those whose refund could not be made (not
	// sent in time, or failed): their charges stay.
	Refunds, RefundsFailed uint64
	// LocalFallbacks counts requests decided by the fallback store
	// (Options.Fallback) because Redis could not answer in time or failed.
	LocalFallbacks uint64
	// LateCharged counts requests answered without Redis's decision (by
	// the failure policy, or denied by the fallback store) that Redis
	// charged anyway: they had been sent before their caller left, and
	// the script ran. See Store.degrade for the bound.
	LateCharged uint64
	// LateUnsure counts requests answered without Redis's decision and
	// not written back (refused, or failed open uncounted) whose pipeline
	// failed in a way that may have let Redis run them (a timeout, a lost
	// connection): Redis may have charged them, and no reply says whether.
	LateUnsure uint64
	// WriteBackHits counts hits allowed without Redis (by the fallback
	// store, or failed open with Options.CountFailedOpen) that were later
	// charged to Redis (as usage accounting: whether or not they fit);
	// WriteBackOverLimit those of them in write-backs that did not fit whole
	// in their limit (charged past it, or as debt); WriteBackDropped the
	// ones lost because the write-back buffer was full; WriteBackPending
	// the keys waiting or being written. Two may be counted twice in Redis:
	// WriteBackRetried counts hits sent again after a write-back failed in
	// a way that may have let it run (a timeout, a lost connection), and
	// WriteBackUnsure the hits written back of calls whose own pipeline
	// failed that way (Redis may have run them when it resumed).
	// WriteBackDroppedAtClose counts the hits still waiting when Close
	// gave up writing them back (Options.CloseWriteBack).
	WriteBackHits, WriteBackOverLimit, WriteBackDropped uint64
	WriteBackDroppedAtClose                             uint64
	WriteBackRetried, WriteBackUnsure                   uint64
	WriteBackPending                                    int

	// ChunkDecided counts requests decided from lease chunks alone, without
	// a Redis call; ApproximateDecided those decided locally with an item of
	// consistency approximate. Lease counts consistency lease's chunks.
	ChunkDecided, ApproximateDecided uint64
	Lease                            LeaseStats
	Approximate                      ApproximateStats

	// NodeTrips counts the times a node (the server, a Cluster master) was
	// found not answering (see Options.StallTimeout), NodeReturns the
	// times one answered again; NodesDown is how many are down now, their
	// calls answered by the failure mode without being sent. StallProbes
	// counts the PINGs that checked a node that stalled, failed on a
	// connection, or was down.
	// NodeDownCalls counts the calls so answered.
	NodeTrips, NodeReturns, StallProbes, NodeDownCalls uint64
	NodesDown                                          int
}

// Stats returns the store's counters.
func (r *Store) Stats() Stats {
	s := Stats{
		Requests:      r.requests.Load(),
		RoundTrips:    r.roundTrips.Load(),
		ScriptCalls:   r.scriptCalls.Load(),
		LocalDenials:  r.localDenials.Load(),
		Errors:        r.errs.Load(),
		ScriptReloads: r.reloads.Load(),
		Decided:       r.decided.Load(),
		NotSent:       r.notSent.Load(),
		OOM:           r.oom.Load(),
		Refunds:       r.refunds.Load(),
		RefundsFailed: r.refundsFailed.Load(),

		LocalFallbacks:          r.localDecisions.Load(),
		LateCharged:             r.lateCharged.Load(),
		LateUnsure:              r.lateUnsure.Load(),
		WriteBackHits:           r.wb.written.Load(),
		WriteBackOverLimit:      r.wb.overLimit.Load(),
		WriteBackDropped:        r.wb.dropped.Load(),
		WriteBackDroppedAtClose: r.wb.droppedAtClose.Load(),
		WriteBackRetried:        r.wb.retried.Load(),
		WriteBackUnsure:         r.wb.unsure.Load(),
		WriteBackPending:        r.wb.pending(),
		ChunkDecided:            r.chunkDecided.Load(),
		ApproximateDecided:      r.approxDecided.Load(),
		Lease:                   r.leaseStats(),
		Approximate:             r.approxStats(),
	}
	if h := r.health; h != nil {
		s.NodeTrips, s.NodeReturns, s.StallProbes, s.NodeDownCalls = h.trips.Load(), h.returns.Load(), h.probes.Load(), h.downCalls.Load()
		s.NodesDown = int(h.down.Load())
	}
	return s
}

func (r *Store) approxStats() ApproximateStats {
	if p, ok := r.approx.(*approxPath); ok {
		return p.stats()
	}
	return ApproximateStats{}
}

func (r *Store) leaseStats() LeaseStats {
	if p, ok := r.lease.(*leasePath); ok {
		return p.stats()
	}
	return LeaseStats{}
}

// Close stops the store: the local paths of lease and approximate return
// their chunks and send their last sync, calls waiting for a pipeline
// return backend.ErrClosed, pipelines in flight finish and answer their
// callers, the hits still waiting to be written back are written back, and
// the connections close; all of it within Options.CloseWriteBack, of which
// the local paths take at most half, and they and the pipelines in flight
// three quarters: the reads still waiting then (a frozen Redis) end, and
// their calls are resolved as timed out (Store.degrade). (Without the
// stall check, Options.StallTimeout negative, the pipelines in flight take
// up to the read timeout.) Apply returns backend.ErrClosed afterwards. Its
// error names the hits that could not be written back or synced. Close is
// idempotent.
func (r *Store) Close() error {
	var err error
	r.closeOnce.Do(func() {
		r.closed.Store(true)
		grace, start := r.closeWriteBack, time.Now()
		local := grace
		if grace > 0 {
			local = grace / 2 // the rest for the write-back
		}
		lerr := r.closeLocal(local)
		close(r.stop)
		r.waitWorkers(start, grace)
		r.unsentQueued()
		rest := grace
		if grace > 0 {
			rest = max(grace-time.Since(start), time.Nanosecond)
		}
		derr := errors.Join(lerr, r.drain(rest))
		if r.deny != nil {
			r.deny.StopAllGoroutines()
		}
		err = errors.Join(derr, r.client.Close())
	})
	return err
}

// waitWorkers waits for the workers to return (Close): their pipelines in
// flight, until three quarters of grace from start (when grace > 0); from
// then on the reads waiting end (see waitCut).
func (r *Store) waitWorkers(start time.Time, grace time.Duration) {
	if grace <= 0 {
		r.wg.Wait()
		return
	}
	ctx, cancel := context.WithDeadline(context.Background(), start.Add(grace*3/4))
	defer cancel()
	r.waitCut(ctx, &r.wg, false)
}

// waitCut waits for wg at Close: the background calls of a local path
// (lease, approximate), or the workers. go-redis ends a read at its
// deadline, not when its context is canceled, so reads are cut short (they
// end as timeouts): with stuck, those a node down or silent has left
// unanswered for as long as a probe's PING may wait (see endStuckReads);
// once ctx is done, every read still waiting. Without the stall check (no
// tracked connections) it waits, within the read timeout.
func (r *Store) waitCut(ctx context.Context, wg *sync.WaitGroup, stuck bool) {
	h := r.health
	if h == nil {
		wg.Wait()
		return
	}
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	tick := time.NewTicker(max(h.stall/4, time.Millisecond))
	defer tick.Stop()
	expired := ctx.Done()
	for {
		select {
		case <-done:
			return
		case <-tick.C:
		case <-expired:
			expired = nil // from now on at each tick
		}
		switch {
		case ctx.Err() != nil:
			h.endAllReads()
		case stuck:
			h.endStuckReads()
		}
	}
}

// Apply implements Store. See Redis for the atomicity it guarantees. It
// returns backend.ErrClosed after Close. When Redis cannot answer before ctx
// ends (ctx may be done already: the call is then not sent), fails, or
// answers something unexpected, the degraded mode decides (see degrade):
// with a Fallback store Apply answers without an error, else it returns
// the error (wrapping ctx.Err() when ctx ended first; the script may still
// run, and its late reply is resolved as degrade describes).
//
// With the local deny cache enabled, a request is answered without Redis
// when every item has hits > 0 and a remembered denial of its key for at
// most as many hits that has not yet passed (until its RetryAfter); its
// Decisions then report what Redis said at that denial (Remaining as of
// then, RetryAfter and ResetAfter counted down), nothing is charged, and
// the verdict is computed as usual. Such a denial stays true until then
// because the key encodes the limit (a per-request override has another
// key) and only time can lower a key's count.
func (r *Store) Apply(ctx context.Context, items []backend.Item, out []algorithms.Decision) (bool, error) {
	return r.ApplyBy(ctx, time.Time{}, items, out)
}

// ApplyBy is Apply with a deadline until beside ctx's (backend.TakesDeadline):
// the call is not sent once until is nearer than a round trip, and the
// caller leaves at until, as under a context with that deadline, whose
// error (context.DeadlineExceeded) it then reports. It spares the caller a
// context with a timer per call: the call waits with a timer of its own,
// reused with the call.
//
// Items whose Consistency is Lease or Approximate may be decided from
// memory instead (see consistency.go); the rest of their request is decided
// here, all or nothing with them.
func (r *Store) ApplyBy(ctx context.Context, until time.Time, items []backend.Item, out []algorithms.Decision) (bool, error) {
	if r.closed.Load() {
		return false, backend.ErrClosed
	}
	if r.routes(items) {
		return r.applyRouted(ctx, until, items, out)
	}
	return r.applyStrict(ctx, until, items, out)
}

// applyStrict decides items in Redis, each one strict: ApplyBy's path for
// a request of Strict items.
func (r *Store) applyStrict(ctx context.Context, until time.Time, items []backend.Item, out []algorithms.Decision) (bool, error) {
	n := len(items)
	if len(out) < n {
		return false, fmt.Errorf("redis: %d decisions for %d items", len(out), n)
	}
	if n == 0 {
		return true, nil
	}
	r.requests.Add(1)
	// start is read before the script runs, so a denial remembered as
	// lasting RetryAfter from start never outlives the true one, which
	// counts from the script's later instant.
	var start int64
	if r.deny != nil {
		start = r.denyClock.Now().UnixMicro()
		if allowed, ok := r.fromDenyCache(start, items, out[:n]); ok {
			r.localDenials.Add(1)
			return allowed, nil
		}
	}
	c := r.newCall(ctx, until, items)
	var err error
	if err = ctx.Err(); err == nil && c.timed && !time.Now().Before(c.until) {
		err = context.DeadlineExceeded
	}
	if err != nil {
		// The budget is spent (or the caller left) before the call could
		// be queued: it is not sent, so it charged nothing, and the
		// failure mode decides as for any call Redis did not answer in
		// time. (A split request's later part gets here when an earlier
		// part used the whole budget.)
		c.state, c.resolved = abandoned, true
		r.notSent.Add(1)
		err = fmt.Errorf("redis: not sent, the call's time was up before it was queued: %w", err)
	} else if n := r.nodeDown(c); n != nil {
		// A node of the call is down: it is not sent, and the failure
		// mode decides at once rather than at the deadline.
		c.state, c.resolved = abandoned, true
		r.health.downCalls.Add(1)
		err = n.downErr()
	} else {
		err = r.do(c)
	}
	if err != nil {
		return r.degrade(c, items, out[:n], err)
	}
	for i := range c.groups {
		if err := decodeGroup(&c.groups[i], items, out); err != nil {
			// The call ran: what it charged is in its reply, so the
			// outcome is resolved as for a late reply.
			c.state = abandoned
			c.resolved, c.chargedBy = true, chargedItems(c)
			return r.degrade(c, items, out[:n], err)
		}
	}
	r.decided.Add(1)
	if !c.whole && !backend.Verdict(items, out[:n]) {
		r.refund(ctx, c, items, out[:n])
	}
	if !r.cluster {
		// Answered: the worker is done with c (see releaseCall).
		releaseCall(c)
	}
	if r.deny != nil {
		r.rememberDenials(start, items, out[:n])
	}
	return backend.Verdict(items, out[:n]), nil
}

// do queues c for a pipeline and waits until it has run or ctx ends. A
// caller that leaves before the call has run abandons it (see call); a call
// that no worker has taken yet is taken back and resolved at once as not
// charged, as is one that could not be queued. Close needs no case of its
// own here: it resolves the calls still queued (backend.ErrClosed), and
// waits for the pipelines in flight, which resolve theirs. (A third case
// in the select, on a channel every caller shares, cost each request
// another lock of that channel when it parks and when it wakes.)
func (r *Store) do(c *call) error {
	if !r.enqueue(c) {
		c.state, c.resolved = abandoned, true
		return backend.ErrClosed
	}
	var timeout <-chan time.Time
	if c.timed {
		// ApplyBy's deadline, earlier than ctx's: a timer of the call's
		// own, reused with the call (a context with a deadline would
		// make one per call, and allocate).
		d := time.Until(c.until)
		if c.timer == nil {
			c.timer = time.NewTimer(d)
		} else {
			c.timer.Reset(d)
		}
		timeout = c.timer.C
	}
	var left error
	select {
	case <-c.done:
		if c.timed {
			c.timer.Stop()
		}
		return c.err
	case <-c.ctx.Done():
		left = c.ctx.Err()
	case <-timeout:
		left = context.DeadlineExceeded
	}
	if c.timed {
		// Stopped (or fired and received): no value is left for the
		// call's next use.
		c.timer.Stop()
	}
	if r.unqueue(c) {
		c.state, c.resolved = abandoned, true
		r.notSent.Add(1)
		return fmt.Errorf("redis: not sent, no pipeline was free before the deadline: %w", left)
	}
	if c.abandon() {
		return left
	}
	<-c.done // the worker finished as the caller was leaving
	return c.err
}
