package main

import (
	"context"
	"errors"
	"fmt"
	"github.com/envoyrls/envoy-rls/internal/testutil"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// server is a running server under test.
type server struct {
	cmd     *exec.Cmd
	redis   *exec.Cmd
	conn    *grpc.ClientConn
	config  string // the config file
	reloads func(ctx context.Context) (string, error)
	stderr  *strings.Builder
}

func (s *server) stop() {
	if s.conn != nil {
		s.conn.Close()
	}
	for _, c := range []*exec.Cmd{s.cmd, s.redis} {
		if c != nil && c.Process != nil {
			c.Process.Signal(syscall.SIGTERM)
			done := make(chan struct{})
			go func() { c.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				c.Process.Kill()
				<-done
			}
		}
	}
}

// reload writes a new config and waits until the server uses it.
func (s *server) reload(yaml string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	before, err := s.reloads(ctx)
	if err != nil {
		return err
	}
	if err := os.WriteFile(s.config, []byte(yaml), 0o644); err != nil {
		return err
	}
	if s.cmd != nil && strings.Contains(s.cmd.Path, "envoy-rls") {
		s.cmd.Process.Signal(syscall.SIGHUP)
	}
	for {
		now, err := s.reloads(ctx)
		if err == nil && now != before {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("config reload not seen: %v", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func startRedis(dir string) (*exec.Cmd, int, error) {
	port, err := testutil.PickPort()
	if err != nil {
		return nil, 0, err
	}
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir)
	if err := cmd.Start(); err != nil {
		return nil, 0, fmt.Errorf("redis-server: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err == nil {
			c.Write([]byte("PING\r\n"))
			buf := make([]byte, 16)
			n, _ := c.Read(buf)
			c.Close()
			if strings.HasPrefix(string(buf[:n]), "+PONG") {
				return cmd, port, nil
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	cmd.Process.Kill()
	cmd.Wait()
	return nil, 0, errors.New("redis-server did not answer PING")
}

// startReference runs the reference with the file provider: the config is
// RUNTIME_ROOT/ratelimit/config/config.yaml, reloaded when the directory
// changes (RUNTIME_WATCH_ROOT=false).
func startReference(bin string, sc *scenario, dir string) (*server, error) {
	rcmd, rport, err := startRedis(dir)
	if err != nil {
		return nil, err
	}
	s := &server{redis: rcmd, stderr: &strings.Builder{}}
	cfgDir := filepath.Join(dir, "runtime", "ratelimit", "config")
	if err := os.MkdirAll(cfgDir, 0o755); err != nil {
		s.stop()
		return nil, err
	}
	s.config = filepath.Join(cfgDir, "config.yaml")
	if err := os.WriteFile(s.config, []byte(sc.config), 0o644); err != nil {
		s.stop()
		return nil, err
	}
	var ports [3]int
	for i := range ports {
		if ports[i], err = testutil.PickPort(); err != nil {
			s.stop()
			return nil, err
		}
	}
	env := []string{
		"HOME=" + dir, "PATH=" + os.Getenv("PATH"),
		"USE_STATSD=false", "DISABLE_STATS=true", "LOG_LEVEL=error",
		"REDIS_SOCKET_TYPE=tcp", "REDIS_TYPE=SINGLE", "REDIS_URL=127.0.0.1:" + strconv.Itoa(rport),
		"RUNTIME_ROOT=" + filepath.Join(dir, "runtime"), "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_APPDIRECTORY=config",
		"RUNTIME_WATCH_ROOT=false",
		"HOST=127.0.0.1", "PORT=" + strconv.Itoa(ports[0]),
		"GRPC_HOST=127.0.0.1", "GRPC_PORT=" + strconv.Itoa(ports[1]),
		"DEBUG_HOST=127.0.0.1", "DEBUG_PORT=" + strconv.Itoa(ports[2]),
	}
	env = append(env, sc.env...)
	s.cmd = exec.Command(bin)
	s.cmd.Env = env
	s.cmd.Stdout, s.cmd.Stderr = io.Discard, s.stderr
	if err := s.cmd.Start(); err != nil {
		s.stop()
		return nil, err
	}
	debug := "http://127.0.0.1:" + strconv.Itoa(ports[2]) + "/rlconfig"
	s.reloads = func(ctx context.Context) (string, error) { return httpGet(ctx, debug) }
	if err := s.connect(ports[1]); err != nil {
		s.stop()
		return nil, err
	}
	return s, nil
}

// startRLS runs envoy-rls with the scenario's flags.
func startRLS(bin, backend string, sc *scenario, dir string) (*server, error) {
	s := &server{stderr: &strings.Builder{}}
	s.config = filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(s.config, []byte(sc.config), 0o644); err != nil {
		return nil, err
	}
	gport, err := testutil.PickPort()
	if err != nil {
		return nil, err
	}
	hport, err := testutil.PickPort()
	if err != nil {
		return nil, err
	}
	args := []string{"serve", "--config", s.config, "--grpc-addr", "127.0.0.1:" + strconv.Itoa(gport),
		"--http-addr", "127.0.0.1:" + strconv.Itoa(hport), "--log-level", "error", "--backend", backend}
	if backend == "redis" {
		rcmd, rport, err := startRedis(dir)
		if err != nil {
			return nil, err
		}
		s.redis = rcmd
		args = append(args, "--redis-url", "redis://127.0.0.1:"+strconv.Itoa(rport))
	}
	args = append(args, sc.flags...)
	s.cmd = exec.Command(bin, args...)
	s.cmd.Env = os.Environ()
	s.cmd.Stdout, s.cmd.Stderr = io.Discard, s.stderr
	if err := s.cmd.Start(); err != nil {
		s.stop()
		return nil, err
	}
	metrics := "http://127.0.0.1:" + strconv.Itoa(hport) + "/metrics"
	s.reloads = func(ctx context.Context) (string, error) {
		body, err := httpGet(ctx, metrics)
		if err != nil {
			return "", err
		}
		for _, line := range strings.Split(body, "\n") {
			if strings.HasPrefix(line, "envoy_rls_config_loads_total") && strings.Contains(line, `result="success"`) {
				return line, nil
			}
		}
		return "", errors.New("no config load metric")
	}
	if err := s.connect(gport); err != nil {
		s.stop()
		return nil, err
	}
	return s, nil
}

func httpGet(ctx context.Context, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// connect dials the gRPC port and waits until the server's health service
// says SERVING.
func (s *server) connect(port int) error {
	conn, err := grpc.NewClient("127.0.0.1:"+strconv.Itoa(port), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	s.conn = conn
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		r, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err == nil && r.Status == healthpb.HealthCheckResponse_SERVING {
			return nil
		}
		if s.cmd.ProcessState != nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("server not serving: %s", s.stderr.String())
}
