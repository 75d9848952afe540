package main

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/envoyrls/envoy-rls/pkg/rls"
)

// limitListener accepts at most max connections open at once. A connection
// accepted beyond that is closed at once, before any byte of it is read:
// the client sees the connection reset or closed right away and can try
// another instance, where a listener that stopped accepting
// (netutil.LimitListener) would leave new connections waiting in the
// kernel's accept queue, their clients hanging until a timeout.
type limitListener struct {
	net.Listener
	max     int64
	open    atomic.Int64
	refused atomic.Uint64
}

func newLimitListener(l net.Listener, max int) *limitListener {
	return &limitListener{Listener: l, max: int64(max)}
}

// Accept returns the next connection within the limit, closing those
// beyond it.
func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open.Add(1) > l.max {
			l.open.Add(-1)
			l.refused.Add(1)
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetLinger(0) // a reset: no FIN_WAIT state kept for a refused client
			}
			c.Close()
			continue
		}
		return &limitedConn{Conn: c, l: l}, nil
	}
}

// limitedConn gives its slot back when it is closed, once.
type limitedConn struct {
	net.Conn
	l    *limitListener
	once sync.Once
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.open.Add(-1) })
	return err
}

// register exports the listener's connections open now and refused as
// open and refused (defined in pkg/rls/metrics.go).
func (l *limitListener) register(reg prometheus.Registerer, open, refused rls.StoreMetric) error {
	return errors.Join(
		reg.Register(open.Collector(func() float64 { return float64(l.open.Load()) })),
		reg.Register(refused.Collector(func() float64 { return float64(l.refused.Load()) })),
	)
}
