package main

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/envoyrls/envoy-rls/pkg/rls"
)

// evictMinAge is how long a connection must have been silent (accepted
// and no request yet) or idle (between requests) before a newcomer may
// evict it. A legitimate client sends its first request right after it
// connects and, when it is busy, its next one soon after the last: a
// connection younger than this may be the newcomer's own kind, caught
// between its connect and its first request, and is never the victim.
// A silent connection older than this is what an attacker holding slots
// looks like.
const evictMinAge = time.Second

// minMaxDraining is the least number of evicted connections that may be
// closing at once (see limitListener.maxDraining).
const minMaxDraining = 64

// connState is where a connection of a limitListener stands.
type connState uint8

const (
	connFresh    connState = iota // accepted, no request yet
	connBusy                      // a request in progress
	connIdle                      // between requests
	connDraining                  // evicted or timed out: being closed; holds no slot
)

// limitListener accepts at most max connections open at once (plus
// reserve for health probes, and the evicted ones still closing). At the
// limit a newcomer evicts, in this order:
//
//  1. the connection accepted longest ago that has sent no request yet
//     and has been silent for at least evictMinAge: the pattern of a
//     client that holds slots;
//  2. the least recently active idle connection, idle for at least
//     evictMinAge;
//
// and takes its slot. A connection in the middle of a request, or younger
// than evictMinAge, is never the victim: the newcomer is then admitted on
// the reserve, if there is one (health requests only), else closed at
// once, before any byte of it is read, as before the limit existed: the
// client sees the connection reset right away and can try another
// instance (a listener that stopped accepting would leave new connections
// waiting in the kernel's accept queue, their clients hanging until a
// timeout).
//
// How an evicted connection is closed is the protocol's business: evict
// (an HTTP/2 GOAWAY for gRPC, a close for HTTP/1).
type limitListener struct {
	net.Listener
	max, reserve int
	maxDraining  int
	// firstRequest closes a connection still without a request after it
	// (0: never), if started says it has begun its protocol (nil: at
	// accept); one that has not is given another firstRequest.
	firstRequest time.Duration
	started      func(*trackedConn) bool
	// evict closes a connection the listener evicted or timed out; it
	// is called without the lock held.
	evict func(*trackedConn)
	// wrap, when set, wraps each connection Accept returns.
	wrap func(*trackedConn) net.Conn
	now  func() time.Time

	mu                      sync.Mutex
	open, reserved, closing int
	fresh, idle, freshResv  connList

	conns, refused, evicted, reservedTotal, firstRequestTimeouts atomic.Uint64
	gauge                                                        atomic.Int64
}

// newLimitListener bounds l to max connections, plus reserve connections
// that newHTTPServer lets ask for health only.
func newLimitListener(l net.Listener, n, reserve int) *limitListener {
	ll := &limitListener{Listener: l, max: n, reserve: reserve, maxDraining: max(minMaxDraining, n/8), now: time.Now}
	ll.evict = func(c *trackedConn) { c.Conn.Close() }
	return ll
}

// Accept returns the next connection within the limit, evicting another
// for it or closing it as the type's comment says.
func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		tc := &trackedConn{Conn: c, l: l}
		victim, ok := l.admit(tc)
		if victim != nil {
			l.evicted.Add(1)
			l.evict(victim)
		}
		if !ok {
			l.refused.Add(1)
			if tcp, ok := c.(*net.TCPConn); ok {
				_ = tcp.SetLinger(0) // a reset: no FIN_WAIT state kept for a refused client
			}
			c.Close()
			continue
		}
		if tc.reserved {
			l.reservedTotal.Add(1)
		}
		if l.wrap != nil {
			return l.wrap(tc), nil
		}
		return tc, nil
	}
}

// admit gives c a slot, evicting a victim for it if needed (returned, to
// be closed by the caller), or reports that c has none.
func (l *limitListener) admit(c *trackedConn) (victim *trackedConn, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	c.since = now
	switch {
	case l.open < l.max:
		l.open++
	case l.closing < l.maxDraining && l.victim(now, &l.fresh, &l.idle) != nil:
		victim = l.victim(now, &l.fresh, &l.idle)
		c.reserved = victim.reserved
		l.drainLocked(victim)
		l.takeSlot(c)
	case l.reserved < l.reserve:
		l.reserved++
		c.reserved = true
	case l.closing < l.maxDraining && l.victim(now, &l.freshResv) != nil:
		victim = l.victim(now, &l.freshResv)
		c.reserved = true
		l.drainLocked(victim)
		l.takeSlot(c)
	default:
		return nil, false
	}
	l.conns.Add(1)
	l.gauge.Add(1)
	l.freshList(c).push(c)
	if l.firstRequest > 0 {
		c.timer = time.AfterFunc(l.firstRequest, func() { l.firstRequestTimeout(c) })
	}
	return victim, true
}

// victim returns the front of the first list whose front has been in it
// for evictMinAge, or nil.
func (l *limitListener) victim(now time.Time, lists ...*connList) *trackedConn {
	for _, ls := range lists {
		if v := ls.head; v != nil && now.Sub(v.since) >= evictMinAge {
			return v
		}
	}
	return nil
}

func (l *limitListener) freshList(c *trackedConn) *connList {
	if c.reserved {
		return &l.freshResv
	}
	return &l.fresh
}

// takeSlot counts c in the slot its reserved says.
func (l *limitListener) takeSlot(c *trackedConn) {
	if c.reserved {
		l.reserved++
	} else {
		l.open++
	}
}

// drainLocked takes c out of its slot and its list: it is being closed.
func (l *limitListener) drainLocked(c *trackedConn) {
	if c.list != nil {
		c.list.remove(c)
	}
	if c.state != connDraining {
		if c.reserved {
			l.reserved--
		} else {
			l.open--
		}
		c.state = connDraining
		l.closing++
	}
}

// firstRequestTimeout closes c if it is still without a request.
func (l *limitListener) firstRequestTimeout(c *trackedConn) {
	l.mu.Lock()
	fresh := c.state == connFresh && !c.closed
	if fresh && l.started != nil && !l.started(c) {
		c.timer.Reset(l.firstRequest)
		fresh = false
	}
	if fresh {
		l.drainLocked(c)
	}
	l.mu.Unlock()
	if fresh {
		l.firstRequestTimeouts.Add(1)
		l.evict(c)
	}
}

// busy records that c has a request in progress.
func (l *limitListener) busy(c *trackedConn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c.state == connFresh || c.state == connIdle {
		c.list.remove(c)
		c.state = connBusy
		if c.timer != nil {
			c.timer.Stop()
		}
	}
}

// idleNow records that c has no request in progress.
func (l *limitListener) idleNow(c *trackedConn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c.state == connBusy && !c.closed {
		c.state = connIdle
		c.since = l.now()
		l.idle.push(c)
	}
}

// closed gives c's slot back, once.
func (l *limitListener) closed(c *trackedConn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c.closed {
		return
	}
	c.closed = true
	if c.timer != nil {
		c.timer.Stop()
	}
	if c.list != nil {
		c.list.remove(c)
	}
	switch {
	case c.state == connDraining:
		l.closing--
	case c.reserved:
		l.reserved--
	default:
		l.open--
	}
	l.gauge.Add(-1)
}

// trackedConn is a connection of a limitListener.
type trackedConn struct {
	net.Conn
	l *limitListener
	// h2 is set by the gRPC wrap once it sees the connection's HTTP/2.
	h2 atomic.Pointer[h2Conn]

	// Guarded by l.mu.
	state      connState
	reserved   bool      // on the reserve: health requests only
	since      time.Time // accepted (fresh) or last became idle (idle)
	closed     bool
	timer      *time.Timer // the first-request timeout
	list       *connList
	prev, next *trackedConn
}

// Close closes the connection and gives its slot back.
func (c *trackedConn) Close() error {
	err := c.Conn.Close()
	c.l.closed(c)
	return err
}

// isReserved reports whether c was admitted on the reserve.
func (c *trackedConn) isReserved() bool {
	c.l.mu.Lock()
	defer c.l.mu.Unlock()
	return c.reserved
}

// connList is a list of connections in the order they were pushed.
type connList struct{ head, tail *trackedConn }

func (ls *connList) push(c *trackedConn) {
	c.list, c.prev, c.next = ls, ls.tail, nil
	if ls.tail != nil {
		ls.tail.next = c
	} else {
		ls.head = c
	}
	ls.tail = c
}

func (ls *connList) remove(c *trackedConn) {
	if c.prev != nil {
		c.prev.next = c.next
	} else {
		ls.head = c.next
	}
	if c.next != nil {
		c.next.prev = c.prev
	} else {
		ls.tail = c.prev
	}
	c.list, c.prev, c.next = nil, nil, nil
}

// connMetrics are the metrics of one listener's connections (defined in
// pkg/rls/metrics.go); a zero one is not exported.
type connMetrics struct {
	open, refused, evicted, reserved, firstRequestTimeouts rls.StoreMetric
}

// register exports the listener's connections as m says.
func (l *limitListener) register(reg prometheus.Registerer, m connMetrics) error {
	var errs []error
	add := func(m rls.StoreMetric, v func() float64) {
		if m.Name != "" {
			errs = append(errs, reg.Register(m.Collector(v)))
		}
	}
	add(m.open, func() float64 { return float64(l.gauge.Load()) })
	add(m.refused, func() float64 { return float64(l.refused.Load()) })
	add(m.evicted, func() float64 { return float64(l.evicted.Load()) })
	add(m.reserved, func() float64 { return float64(l.reservedTotal.Load()) })
	add(m.firstRequestTimeouts, func() float64 { return float64(l.firstRequestTimeouts.Load()) })
	return errors.Join(errs...)
}

// connKey is the context key of an HTTP request's *trackedConn.
type connKey struct{}

// trackHTTP lets l follow the requests of srv's connections: a connection
// is busy from the moment its request's headers are read (the handler
// runs) and idle again when the server waits for its next request.
func (l *limitListener) trackHTTP(srv *http.Server) {
	srv.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
		if tc, ok := c.(*trackedConn); ok {
			return context.WithValue(ctx, connKey{}, tc)
		}
		return ctx
	}
	srv.ConnState = func(c net.Conn, st http.ConnState) {
		tc, ok := c.(*trackedConn)
		if !ok {
			return
		}
		switch st {
		case http.StateActive:
			l.resume(tc)
		case http.StateIdle:
			l.idleNow(tc)
		}
	}
}

// resume records that idle c has begun a request (a fresh connection
// becomes busy only once its headers are read: slow headers leave it
// fresh).
func (l *limitListener) resume(c *trackedConn) {
	l.mu.Lock()
	idle := c.state == connIdle
	l.mu.Unlock()
	if idle {
		l.busy(c)
	}
}

// httpHandler marks a request's connection busy and, on a connection of
// the reserve, serves only the paths in allowed (503 for the others,
// before any of the body is read) and closes the connection after the
// response, giving the slot back.
func (l *limitListener) httpHandler(h http.Handler, allowed map[string]bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if c, ok := r.Context().Value(connKey{}).(*trackedConn); ok {
			l.busy(c)
			if c.isReserved() {
				w.Header().Set("Connection", "close")
				if !allowed[r.URL.Path] {
					http.Error(w, "connection limit reached: only health requests are served on this connection", http.StatusServiceUnavailable)
					return
				}
			}
		}
		h.ServeHTTP(w, r)
	})
}
