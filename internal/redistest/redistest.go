// Package redistest starts real redis-server processes for tests: a
// standalone server or a Redis Cluster of several masters, each on a free
// loopback port, in a temporary directory, without persistence. Every server
// is stopped when the test ends. Starting a server waits, in the last minute
// before a full hour, until the hour has begun (testutil.ClearOfHourEnd).
//
// The binary is found as $REDIS_SERVER, then redis-server on $PATH, then
// /usr/bin/redis-server. When none exists the test fails with a message that
// says how to install it; it never skips, because a test that silently does
// not run proves nothing (CI installs redis-server, see .ci/run).
package redistest

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/envoyrls/envoy-rls/internal/testutil"
)

// startTimeout bounds how long a server may take to answer PING, and a
// cluster to reach cluster_state:ok.
const startTimeout = 20 * time.Second

// pollInterval is the pause between two polls of a server's state.
const pollInterval = 5 * time.Millisecond

// Server is one redis-server process on 127.0.0.1. Its methods are safe for
// concurrent use.
type Server struct {
	tb    testing.TB
	bin   string
	dir   string
	port  int
	conf  string // config file, for a Sentinel
	extra []string
	tls   *tls.Config // client TLS configuration of a TLS-only server

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has exited
}

// StartStandalone starts a standalone redis-server on a free loopback port
// and stops it when the test ends.
func StartStandalone(tb testing.TB) *Server {
	tb.Helper()
	return start(tb, nil, false)
}

// start starts a server with extra arguments. With cluster set, the port
// plus 10000 (the cluster bus) must be free as well.
func start(tb testing.TB, extra []string, cluster bool) *Server {
	tb.Helper()
	return startConf(tb, "", nil, extra, cluster)
}

// startTLS starts a TLS-only server with extra arguments (the certificate
// files); client is the TLS configuration a client needs to reach it.
func startTLS(tb testing.TB, extra []string, client *tls.Config) *Server {
	tb.Helper()
	return startServer(tb, "", nil, extra, false, client)
}

// startConf starts a server; when conf is set, it writes the config file
// made by conf(port) into the server's directory and passes it first.
func startConf(tb testing.TB, name string, conf func(port int) string, extra []string, cluster bool) *Server {
	tb.Helper()
	return startServer(tb, name, conf, extra, cluster, nil)
}

func startServer(tb testing.TB, name string, conf func(port int) string, extra []string, cluster bool, client *tls.Config) *Server {
	tb.Helper()
	bin := serverBinary(tb)
	// A test on a real Redis counts on Redis's clock (TIME): it must not
	// run across the end of an hour, where its windows of an hour or
	// longer would start again.
	testutil.ClearOfHourEnd(tb)
	dir := tb.TempDir()
	var lastErr error
	for attempt := 0; attempt < 20; attempt++ {
		port, err := freePort(tb, cluster)
		if err != nil {
			lastErr = err
			continue
		}
		s := &Server{tb: tb, bin: bin, dir: dir, port: port, extra: extra, tls: client}
		if conf != nil {
			s.conf = filepath.Join(dir, name)
			if err := os.WriteFile(s.conf, []byte(conf(port)), 0o644); err != nil {
				tb.Fatalf("redistest: %v", err)
			}
		}
		if err := s.launch(); err != nil {
			// Most likely another process took the port between our probe
			// and redis-server's bind: try another one.
			lastErr = err
			continue
		}
		tb.Cleanup(s.Stop)
		return s
	}
	tb.Fatalf("redistest: cannot start redis-server: %v", lastErr)
	return nil
}

// serverBinary returns the path of the redis-server binary, failing the test with
// an explanation when there is none.
func serverBinary(tb testing.TB) string {
	tb.Helper()
	if testing.Short() {
		// The short tier (go test -short) runs what needs no process of
		// its own; make test runs everything.
		tb.Skip("redistest: needs a redis-server process; skipped with -short")
	}
	if p := os.Getenv("REDIS_SERVER"); p != "" {
		if _, err := os.Stat(p); err != nil {
			tb.Fatalf("redistest: $REDIS_SERVER=%q: %v", p, err)
		}
		return p
	}
	if p, err := exec.LookPath("redis-server"); err == nil {
		return p
	}
	if _, err := os.Stat("/usr/bin/redis-server"); err == nil {
		return "/usr/bin/redis-server"
	}
	tb.Fatalf("redistest: redis-server not found (set $REDIS_SERVER or install it, e.g. `apt-get install -y redis-server`); " +
		"the Redis tests need a real server and are not skipped")
	return ""
}

// freePort returns a loopback TCP port for a server started now, which no
// other test picks meanwhile (see testutil.ReservePort). With cluster set,
// port+10000 (the cluster bus) is reserved too and the port is below 55536.
func freePort(tb testing.TB, cluster bool) (int, error) {
	for i := 0; i < 50; i++ {
		port := testutil.FreePort(tb)
		if !cluster {
			return port, nil
		}
		if port+10000 > 65535 {
			continue
		}
		if _, err := testutil.ReservePort(port + 10000); err != nil {
			continue
		}
		return port, nil
	}
	return 0, errors.New("no free port pair for a cluster node")
}

// launch starts the process and waits until it answers PING, or fails when
// it exits or does not answer within startTimeout.
func (s *Server) launch() error {
	var args []string
	if s.conf != "" {
		args = append(args, s.conf) // a config file comes first
	}
	if s.tls != nil {
		args = append(args, "--port", "0", "--tls-port", strconv.Itoa(s.port))
	} else {
		args = append(args, "--port", strconv.Itoa(s.port))
	}
	args = append(args,
		"--bind", "127.0.0.1",
		"--dir", s.dir,
		"--save", "",
		"--appendonly", "no",
		"--daemonize", "no",
		"--logfile", filepath.Join(s.dir, "redis.log"),
	)
	args = append(args, s.extra...)
	cmd := exec.Command(s.bin, args...)
	cmd.Dir = s.dir
	setDeathSignal(cmd)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", s.bin, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	s.mu.Lock()
	s.cmd, s.exited = cmd, exited
	s.mu.Unlock()

	if err := s.waitPing(exited); err != nil {
		_ = cmd.Process.Kill()
		<-exited
		return fmt.Errorf("redis-server on port %d: %w\n%s%s", s.port, err, out.String(), s.logTail())
	}
	return nil
}

// waitPing polls PING until it succeeds, the process exits or startTimeout
// passes.
func (s *Server) waitPing(exited <-chan struct{}) error {
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), TLSConfig: s.tls, MaxRetries: -1, DialTimeout: time.Second, PoolSize: 1})
	defer c.Close()
	deadline := time.Now().Add(startTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			return errors.New("exited during start-up")
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no answer to PING within %v: %w", startTimeout, err)
		}
		time.Sleep(pollInterval)
	}
}

func (s *Server) logTail() string {
	b, err := os.ReadFile(filepath.Join(s.dir, "redis.log"))
	if err != nil {
		return ""
	}
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return "log:\n" + string(b)
}

// Addr returns the server's address, "127.0.0.1:port".
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// Port returns the server's TCP port.
func (s *Server) Port() int { return s.port }

// URL returns the server's redis:// URL (database 0), rediss:// for a TLS
// server.
func (s *Server) URL() string {
	if s.tls != nil {
		return "rediss://" + s.Addr() + "/0"
	}
	return "redis://" + s.Addr() + "/0"
}

// Client returns a go-redis client of the server (over TLS with the client
// certificate for a TLS server), closed when the test ends.
func (s *Server) Client() *redis.Client {
	var conf *tls.Config
	if s.tls != nil {
		conf = s.tls.Clone()
	}
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), TLSConfig: conf})
	s.tb.Cleanup(func() { c.Close() })
	return c
}

// Running reports whether the process is running.
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.exited == nil {
		return false
	}
	select {
	case <-s.exited:
		return false
	default:
		return true
	}
}

// Pause freezes the server with SIGSTOP: it keeps its connections open but
// answers nothing, like a hung Redis. Resume undoes it; the test's cleanup
// resumes a paused server so it can be stopped.
func (s *Server) Pause() {
	s.tb.Helper()
	s.signal(syscall.SIGSTOP)
	s.tb.Cleanup(func() { s.signal(syscall.SIGCONT) })
}

// Resume continues a server frozen by Pause.
func (s *Server) Resume() {
	s.tb.Helper()
	s.signal(syscall.SIGCONT)
}

func (s *Server) signal(sig syscall.Signal) {
	s.mu.Lock()
	cmd := s.cmd
	s.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		s.tb.Fatalf("redistest: signal %v to a server that is not running", sig)
	}
	_ = cmd.Process.Signal(sig)
}

// Stop kills the server (SIGKILL, like a crash) and waits until it has
// exited. Stopping a stopped server does nothing.
func (s *Server) Stop() {
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-exited
}

// Restart starts the server again on the same port and directory after a
// Stop, and waits until it answers PING. The data is gone (no persistence),
// and so is the script cache. A cluster node keeps its identity and slots
// (nodes.conf survives).
func (s *Server) Restart() {
	s.tb.Helper()
	if s.Running() {
		s.tb.Fatalf("redistest: Restart of a running server on port %d", s.port)
	}
	var err error
	for attempt := 0; attempt < 50; attempt++ {
		// The port may still be held briefly by a dying connection; the
		// server sets SO_REUSEADDR, so a retry soon succeeds.
		if err = s.launch(); err == nil {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.tb.Fatalf("redistest: restart on port %d: %v", s.port, err)
}
