package redis

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// DefaultStallTimeout is Options.StallTimeout when it is zero: well above
// a healthy round trip under load (a full pipeline takes a few
// milliseconds, a garbage collection or a busy host adds a few more), well
// below the deadlines Envoy gives its calls (20 ms by default) times the
// callers that would each wait one out.
const DefaultStallTimeout = 50 * time.Millisecond

// forgetDown is how long a Cluster master stays down with no call for its
// slots: after a failover its slots are another master's, and it would
// otherwise be probed, and counted down, for good.
const forgetDown = 5 * time.Second

// ErrNodeDown is wrapped by the error of a call that was not sent because
// the Redis server (a Cluster: the master of one of its keys) was found
// not answering: see Options.StallTimeout.
var ErrNodeDown = errors.New("redis: node not answering")

// NodeHealth is a change of a node's state, for Options.OnNodeHealth.
type NodeHealth struct {
	// Addr is the node's address (a Cluster master's), or "" for the one
	// server of a standalone or Sentinel setup.
	Addr string
	// Down: the node was found not answering, and calls for its keys
	// answer by the failure mode until a probe answers again. Else the
	// node answers again, after being down for Down's duration (For).
	Down bool
	// Err is why the probe failed (Down), nil otherwise.
	Err error
	// For is how long the node was down (when it is up again).
	For time.Duration
}

// health notices a stalled or dead node fast, once for all its callers,
// rather than each caller at its own deadline (DESIGN rule 9), without
// mistaking a busy server for a dead one:
//
//   - Each node (the server; a Cluster: each master) counts its pipelines
//     in flight and the instant of its last progress: the last reply byte
//     read from any of its connections, or the sending of a pipeline when
//     none was in flight.
//   - When pipelines are in flight and nothing came back for the stall
//     timeout, or a pipeline failed on its connection (refused, reset,
//     closed), a probe runs: a PING on a connection of its own, with the
//     stall timeout as its deadline. Only when it fails too, and no reply
//     came back on the store's connections meanwhile, is the node marked
//     down. A long pipeline on a busy server does not trip it: its
//     replies come, or the PING is answered between its commands (the
//     PING's deadline is the stall timeout plus the recent longest round
//     trip once per pipeline in flight and once more, as it may wait
//     behind the script calls Redis runs whole).
//   - While a node is down, calls for its keys are not sent: they answer
//     by the failure mode at once (ErrNodeDown). On a Cluster the reads
//     waiting on the node's connections end too: the pipelines stuck on
//     them carry other masters' calls, which would otherwise wait with
//     them (their own calls then count as maybe charged, see
//     Store.degrade). A standalone server's pipelines keep waiting for
//     their replies (within the read timeout), which say what Redis
//     charged; their callers leave at their own deadlines. A probe runs every
//     stall timeout and marks the node up as soon as it answers.
//
// So a frozen node is noticed within twice the stall timeout (plus a tick
// of a quarter of it, and the round trips above), a refused connection at
// once.
type health struct {
	stall   time.Duration
	epoch   time.Time
	cluster *goredis.ClusterClient // nil: one node
	one     *nodeHealth            // the node of a standalone or Sentinel setup

	mu    sync.Mutex
	nodes map[string]*nodeHealth // a Cluster's, by address

	down    atomic.Int32 // nodes down
	closed  atomic.Bool  // the probes are closed: no new probe client
	trips   atomic.Uint64
	returns atomic.Uint64
	probes  atomic.Uint64
	// downCalls counts the calls not sent because a node was down.
	downCalls atomic.Uint64
	kick      chan struct{} // a pipeline failed on its connection: probe now
	newProbe  func(addr string) goredis.UniversalClient
	notify    func(NodeHealth)
	// slow is about the longest recent successful round trip (ns): the
	// longest since, decaying by a sixteenth at each round trip.
	slow      atomic.Int64
	pipelines int // the store's pipelines in flight at most
	// onDown answers the calls waiting for a pipeline of a node found
	// down (Store.dropPending).
	onDown    func(*nodeHealth)
	downProbe time.Duration // the deadline of a down node's probe: the read timeout
}

// nodeHealth is the state of one node.
type nodeHealth struct {
	h    *health
	addr string

	inflight atomic.Int64 // pipelines in flight on it
	progress atomic.Int64 // h.now() of its last progress
	down     atomic.Bool
	refused  atomic.Int64 // h.now() when a call was last refused for it
	suspect  atomic.Bool  // a pipeline failed on its connection
	probing  atomic.Bool
	warmed   atomic.Bool // a PING was answered on the probe's connection
	// cause is why the probe that found it down failed (an error).
	cause atomic.Pointer[error]

	// The watchdog's own.
	warm      bool // its probe's connection was opened once
	lastProbe int64
	downAt    time.Time

	mu    sync.Mutex
	conns map[*trackedConn]struct{} // its open connections (of the store's client)
	probe goredis.UniversalClient
	// warmDone closes when the PING that opens the probe's connection
	// has its answer, warmErr. The warm-up does not hold off a probe (a
	// freeze may meet it: it would wait for the read timeout); a probe
	// due meanwhile takes its answer (see ping).
	warmDone chan struct{}
	warmErr  error
}

func newHealth(stall time.Duration, notify func(NodeHealth)) *health {
	h := &health{stall: stall, epoch: time.Now(), nodes: map[string]*nodeHealth{}, kick: make(chan struct{}, 1), notify: notify}
	h.one = h.newNode("")
	return h
}

func (h *health) newNode(addr string) *nodeHealth {
	return &nodeHealth{h: h, addr: addr, conns: map[*trackedConn]struct{}{}}
}

// now is the monotonic time since h was made.
func (h *health) now() int64 { return int64(time.Since(h.epoch)) }

// node returns the node of addr: the one node unless on a Cluster.
func (h *health) node(addr string) *nodeHealth {
	if h.cluster == nil {
		return h.one
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	n := h.nodes[addr]
	if n == nil {
		n = h.newNode(addr)
		h.nodes[addr] = n
	}
	return n
}

// slotNode returns the node of the master of the slot of key (nil when
// the Cluster's state is not known).
func (h *health) slotNode(key string) *nodeHealth {
	if h.cluster == nil {
		return h.one
	}
	c, err := h.cluster.MasterForKey(context.Background(), key)
	if err != nil {
		return nil
	}
	return h.node(c.Options().Addr)
}

// callDown returns the first node down among those of c's groups, nil when
// none is (the common case costs one atomic load).
func (h *health) callDown(c *call) *nodeHealth {
	if h.down.Load() == 0 {
		return nil
	}
	if h.cluster == nil {
		return h.one
	}
	for i := range c.groups {
		g := &c.groups[i]
		if len(g.items) == 0 {
			continue
		}
		if n := h.slotNode(g.items[0].key); n != nil && n.down.Load() {
			return n
		}
	}
	return nil
}

// nodeDown returns a node of c that is down, nil when none is or the
// check is off.
func (r *Store) nodeDown(c *call) *nodeHealth {
	if r.health == nil {
		return nil
	}
	return r.health.callDown(c)
}

// callOn reports whether one of c's groups is for n.
func (h *health) callOn(c *call, n *nodeHealth) bool {
	if h.cluster == nil {
		return n == h.one
	}
	for i := range c.groups {
		if g := &c.groups[i]; len(g.items) > 0 && h.slotNode(g.items[0].key) == n {
			return true
		}
	}
	return false
}

// dropPending answers the calls waiting for a pipeline that are for n (a
// node just found down) by the failure mode at once: they were not sent.
// (A worker may be held by a pipeline stuck on n.)
func (r *Store) dropPending(n *nodeHealth) {
	r.mu.Lock()
	var drop []*call
	kept := r.pending[:0]
	for _, c := range r.pending {
		if r.health.callOn(c, n) {
			c.taken = true // the caller's unqueue finds it gone
			r.pendingCmds -= len(c.groups)
			drop = append(drop, c)
		} else {
			kept = append(kept, c)
		}
	}
	clear(r.pending[len(kept):])
	r.pending = kept
	r.mu.Unlock()
	for _, c := range drop {
		r.health.downCalls.Add(1)
		c.err = n.downErr()
		c.finish(notCharged)
	}
}

// downErr is the error of a call not sent because n is down.
func (n *nodeHealth) downErr() error {
	n.refused.Store(n.h.now())
	where := "redis"
	if n.addr != "" {
		where = "redis node " + n.addr
	}
	var cause error
	if p := n.cause.Load(); p != nil {
		cause = *p
	}
	var ne net.Error
	if cause == nil || errors.Is(cause, context.DeadlineExceeded) || (errors.As(cause, &ne) && ne.Timeout()) {
		return fmt.Errorf("%w: %s: PING timed out, no reply for %v; calls answer by the failure mode until it answers again", ErrNodeDown, where, n.h.stall)
	}
	// The probe's error is wrapped (a refused or reset connection), so
	// that it is named where errors are classified, as before the check.
	return fmt.Errorf("%w: %s: PING failed: %w; calls answer by the failure mode until it answers again", ErrNodeDown, where, cause)
}

// noteRoundTrip records the duration of a successful round trip.
func (h *health) noteRoundTrip(d time.Duration) {
	for {
		old := h.slow.Load()
		if h.slow.CompareAndSwap(old, max(int64(d), old-old/16)) {
			return
		}
	}
}

// begin counts a pipeline sent to n.
func (n *nodeHealth) begin() {
	if n.inflight.Add(1) == 1 {
		n.progress.Store(n.h.now())
	}
}

// end counts a pipeline of n returned; failed on its connection (err is
// not a reply of Redis), it makes the watchdog probe n at once.
func (n *nodeHealth) end(err error) {
	n.inflight.Add(-1)
	if err != nil && connFailed(err) && !n.down.Load() {
		n.suspect.Store(true)
		select {
		case n.h.kick <- struct{}{}:
		default:
		}
	}
}

// connFailed reports whether err is a failure of the connection rather
// than an error reply of Redis (which proves the server answers).
func connFailed(err error) bool {
	var re goredis.Error
	if errors.As(err, &re) {
		return false
	}
	return !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, goredis.ErrClosed)
}

// watch runs the probes until stop closes.
func (h *health) watch(stop <-chan struct{}, wg *sync.WaitGroup) {
	defer wg.Done()
	tick := time.NewTicker(max(h.stall/4, time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-stop:
			h.closeProbes()
			return
		case <-tick.C:
		case <-h.kick:
		}
		h.check(stop, wg)
	}
}

// check starts the probes due: of the nodes down every stall timeout, of
// the others when they stall or failed on a connection.
func (h *health) check(stop <-chan struct{}, wg *sync.WaitGroup) {
	now := h.now()
	stall := int64(h.stall)
	visit := func(n *nodeHealth) {
		if n.probing.Load() {
			return
		}
		switch {
		case n.down.Load():
			if h.cluster != nil && now-n.refused.Load() > int64(forgetDown) {
				// No call for its slots: a failover moved them to another
				// master. If they are still its, the next call finds out.
				n.up()
				return
			}
			if now-n.lastProbe < stall {
				return
			}
		case n.suspect.Swap(false):
		case n.inflight.Load() > 0 && now-n.progress.Load() >= stall:
		case n.inflight.Load() > 0 && !n.warm:
			// The node has traffic: open the probe's connection ahead
			// of need, so that a stall's PING does not wait for one.
			n.warm = true
			done := make(chan struct{})
			n.mu.Lock()
			n.warmDone = done
			n.mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				n.warmUp(done)
			}()
			return
		default:
			return
		}
		n.lastProbe = now
		n.probing.Store(true)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer n.probing.Store(false)
			n.runProbe(stop)
		}()
	}
	if h.cluster == nil {
		visit(h.one)
		return
	}
	h.mu.Lock()
	nodes := make([]*nodeHealth, 0, len(h.nodes))
	for _, n := range h.nodes {
		nodes = append(nodes, n)
	}
	h.mu.Unlock()
	for _, n := range nodes {
		visit(n)
	}
}

// warmUp opens n's probe connection with a PING, whose answer closes done
// (a probe due meanwhile takes it: see runProbe).
func (n *nodeHealth) warmUp(done chan struct{}) {
	err := goredis.ErrClosed
	if p := n.probeClient(); p != nil {
		ctx, cancel := context.WithTimeout(context.Background(), n.h.downProbe)
		err = p.Ping(ctx).Err()
		cancel()
	}
	if err == nil {
		n.warmed.Store(true)
	}
	n.mu.Lock()
	n.warmErr = err
	n.mu.Unlock()
	close(done)
}

// probeClient returns n's probe client, new if none, nil once the probes
// are closed (Store.Close).
func (n *nodeHealth) probeClient() goredis.UniversalClient {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.probe == nil && !n.h.closed.Load() {
		n.probe = n.h.newProbe(n.addr)
	}
	return n.probe
}

// warming returns the channel that closes with the warm-up's answer while
// its PING is under way, nil otherwise.
func (n *nodeHealth) warming() chan struct{} {
	n.mu.Lock()
	done := n.warmDone
	n.mu.Unlock()
	select {
	case <-done:
		return nil
	default:
		return done
	}
}

// ping PINGs n on p within timeout. While the warm-up's PING is under way
// on the probe's one connection, its answer is the probe's: it was sent
// earlier, so it is at least as lenient as a PING of its own, which would
// wait behind it.
func (n *nodeHealth) ping(p goredis.UniversalClient, timeout time.Duration, stop <-chan struct{}) error {
	if done := n.warming(); done != nil {
		t := time.NewTimer(timeout)
		defer t.Stop()
		select {
		case <-done:
			n.mu.Lock()
			defer n.mu.Unlock()
			return n.warmErr
		case <-t.C:
			return context.DeadlineExceeded
		case <-stop:
			return goredis.ErrClosed
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return p.Ping(ctx).Err()
}

// runProbe PINGs n on its probe connection and marks n down or up.
func (n *nodeHealth) runProbe(stop <-chan struct{}) {
	h := n.h
	p := n.probeClient()
	if p == nil {
		return
	}
	h.probes.Add(1)
	// A PING waits behind the script calls Redis is running (a script
	// runs whole), at most those of the pipelines in flight and one more:
	// it gets as many of the recent longest round trips more than the
	// stall timeout, so that a server busy with long pipelines answers in
	// time.
	timeout := h.stall + time.Duration(h.pipelines+1)*time.Duration(h.slow.Load())
	if p.PoolStats().TotalConns == 0 || n.warming() != nil {
		// A new connection first (or the warm-up's, under way): its
		// handshake waits the same way.
		timeout += h.stall
	}
	if n.down.Load() {
		// Nothing waits on a node down: the PING may wait as long as a
		// pipeline would (it is answered the moment a frozen server
		// resumes), so that a busy host does not keep the node down.
		timeout = max(timeout, h.downProbe)
	}
	start := h.now()
	err := n.ping(p, timeout, stop)
	if err != nil && !n.down.Load() {
		if n.progress.Load() >= start {
			// A reply came back on the store's connections meanwhile:
			// the server answers, and the probe's connection failed
			// alone.
			err = nil
		} else if late := time.Duration(h.now()-start) - timeout; late > timeout {
			// This process ran late (a busy host): the reply may wait
			// unread. Not a verdict: the next tick probes again.
			return
		}
	}
	select {
	case <-stop:
		return
	default:
	}
	if err != nil {
		// A fresh client at the next probe: go-redis's pool refuses to
		// dial again for a second after a failed dial.
		// A warm-up still under way was on it: the next probe PINGs on
		// its own.
		n.mu.Lock()
		if n.probe == p {
			n.probe = nil
		}
		n.warmDone = nil
		n.mu.Unlock()
		_ = p.Close()
		n.cause.Store(&err)
		if n.down.CompareAndSwap(false, true) {
			n.downAt = time.Now()
			n.refused.Store(h.now())
			h.down.Add(1)
			h.trips.Add(1)
			if h.cluster != nil {
				n.endReads()
			}
			if h.onDown != nil {
				h.onDown(n)
			}
			if h.notify != nil {
				h.notify(NodeHealth{Addr: n.addr, Down: true, Err: err})
			}
		}
		return
	}
	// It answers: a stall was a busy server, or the node is back.
	n.warmed.Store(true)
	n.progress.Store(h.now())
	n.up()
}

// up marks n up when it was down.
func (n *nodeHealth) up() {
	h := n.h
	if n.down.CompareAndSwap(true, false) {
		h.down.Add(-1)
		h.returns.Add(1)
		if h.notify != nil {
			h.notify(NodeHealth{Addr: n.addr, For: time.Since(n.downAt)})
		}
	}
}

// endReads ends the reads waiting on n's connections: the pipelines
// waiting for replies fail at once (their callers' failure mode decides,
// see Store.degrade), and go-redis drops those connections (a timeout).
// Idle connections stay in the pool. A Cluster's pipelines only: see
// health.
func (n *nodeHealth) endReads() {
	// Reads that began since the stall did not see it all: a command
	// sent later (by another path of the store) has its own deadline.
	n.endReadsSince(n.h.now() - int64(n.h.stall))
}

// endReadsSince ends the reads on n's connections that began at before or
// earlier.
func (n *nodeHealth) endReadsSince(before int64) {
	n.mu.Lock()
	var conns []*trackedConn
	for c := range n.conns {
		if since := c.readSince.Load(); since != 0 && since <= before {
			conns = append(conns, c)
		}
	}
	n.mu.Unlock()
	for _, c := range conns {
		// go-redis set its own read deadline before the read began.
		_ = c.Conn.SetReadDeadline(time.Now())
	}
}

// endAllReads ends the reads waiting on every node's connections (Close,
// once its grace for the pipelines in flight is spent).
func (h *health) endAllReads() {
	now := h.now()
	for _, n := range h.allNodes() {
		n.endReadsSince(now)
	}
}

// endStuckReads ends the reads that a node has left unanswered for as long
// as a probe's PING may wait (see runProbe), on the nodes down or with no
// progress for that long (Close): a busy server's replies keep coming, or
// come within it.
func (h *health) endStuckReads() {
	now := h.now()
	budget := int64(h.stall) + int64(h.pipelines+1)*h.slow.Load()
	for _, n := range h.allNodes() {
		if n.down.Load() || now-n.progress.Load() >= budget {
			n.endReadsSince(now - budget)
		}
	}
}

// allNodes returns the nodes: the one node, and a Cluster's.
func (h *health) allNodes() []*nodeHealth {
	h.mu.Lock()
	defer h.mu.Unlock()
	nodes := make([]*nodeHealth, 0, len(h.nodes)+1)
	nodes = append(nodes, h.one)
	for _, n := range h.nodes {
		nodes = append(nodes, n)
	}
	return nodes
}

func (h *health) closeProbes() {
	h.closed.Store(true)
	for _, n := range h.allNodes() {
		n.mu.Lock()
		if n.probe != nil {
			_ = n.probe.Close()
			n.probe = nil
		}
		n.mu.Unlock()
	}
}

// dialer returns the dialer of the store's client: go-redis's own (TCP,
// or TLS with tlsConf), whose connections mark their node's progress at
// each read.
func (h *health) dialer(timeout time.Duration, tlsConf *tls.Config) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		d := &net.Dialer{Timeout: timeout, KeepAlive: 5 * time.Minute}
		var c net.Conn
		var err error
		if tlsConf == nil {
			c, err = d.DialContext(ctx, network, addr)
		} else {
			c, err = (&tls.Dialer{NetDialer: d, Config: tlsConf}).DialContext(ctx, network, addr)
		}
		if err != nil {
			return nil, err
		}
		n := h.node(addr)
		t := &trackedConn{Conn: c, n: n}
		n.mu.Lock()
		n.conns[t] = struct{}{}
		n.mu.Unlock()
		if s, ok := c.(syscall.Conn); ok {
			// go-redis checks a pooled connection through its file
			// descriptor before reuse (a closed peer is noticed then).
			return &trackedSysConn{trackedConn: t, sys: s}, nil
		}
		return t, nil
	}
}

// trackedConn marks its node's progress at each read of a reply byte.
type trackedConn struct {
	net.Conn
	n    *nodeHealth
	once sync.Once
	// readSince is the node's now() when the Read in progress began
	// (at least 1), 0 when none is.
	readSince atomic.Int64
}

func (c *trackedConn) Read(b []byte) (int, error) {
	c.readSince.Store(max(c.n.h.now(), 1))
	k, err := c.Conn.Read(b)
	c.readSince.Store(0)
	if k > 0 {
		c.n.progress.Store(c.n.h.now())
	}
	return k, err
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.n.mu.Lock()
		delete(c.n.conns, c)
		c.n.mu.Unlock()
	})
	return c.Conn.Close()
}

type trackedSysConn struct {
	*trackedConn
	sys syscall.Conn
}

func (c *trackedSysConn) SyscallConn() (syscall.RawConn, error) { return c.sys.SyscallConn() }
