package main

import (
	"bufio"
	"bytes"
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

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

func numCPU() int {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return 0
	}
	return bytes.Count(b, []byte("\nprocessor")) + 1
}

// freeAddr returns a loopback address no other pick takes for a minute.
func freeAddr() (string, error) {
	port, err := testutil.PickPort()
	if err != nil {
		return "", err
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), nil
}

func start(o options, name, work, cfg string) (*system, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	s := &system{name: name, addr: addr}
	logf, err := os.Create(filepath.Join(work, name+".log"))
	if err != nil {
		return nil, err
	}
	// With --profile, the Go servers (the floor and envoy-rls) serve
	// /debug/pprof/ on an address of their own.
	var debugArgs []string
	if o.profileDir != "" && name != "reference" {
		if s.debugAddr, err = freeAddr(); err != nil {
			return s, err
		}
		debugArgs = []string{"--debug-addr", s.debugAddr}
	}
	var cmd *exec.Cmd
	switch name {
	case "floor":
		args := append([]string{"--addr", addr}, debugArgs...)
		cmd = exec.Command(filepath.Join(o.binDir, "envoy-rls-floor"), args...)
	case "memory", "redis", "lease", "approximate", "redis-b":
		args := []string{"serve", "--config", cfg, "--grpc-addr", addr, "--http-addr", "",
			"--watch-config=false", "--log-level", "warn", "--backend-timeout", "1s"}
		args = append(args, debugArgs...)
		bin := filepath.Join(o.binDir, "envoy-rls")
		if name != "memory" {
			if s.redis, err = startRedis(o, work, name); err != nil {
				return s, err
			}
			extra := strings.Fields(o.extraArgs)
			if name == "lease" || name == "approximate" {
				extra = append(extra, "--consistency", name)
			}
			if name == "redis-b" {
				extra = strings.Fields(o.extraArgsB)
				if o.binB != "" {
					bin = o.binB
				}
			}
			args = append(args, "--backend", "redis", "--redis-url", "redis://"+s.redis.addr+"/0")
			args = append(args, extra...)
			s.notes = filepath.Base(bin) + " " + strings.Join(args[len(args)-len(extra)-4:], " ")
			if name == "redis-b" {
				s.notes = bin + " " + strings.Join(args[len(args)-len(extra)-4:], " ")
			}
		} else {
			args = append(args, "--backend", "memory")
		}
		cmd = exec.Command(bin, args...)
	case "reference":
		if s.redis, err = startRedis(o, work, name); err != nil {
			return s, err
		}
		debug, err := freeAddr()
		if err != nil {
			return s, err
		}
		http, err := freeAddr()
		if err != nil {
			return s, err
		}
		cmd = exec.Command(o.refBin)
		gh, gp, _ := net.SplitHostPort(addr)
		dh, dp, _ := net.SplitHostPort(debug)
		hh, hp, _ := net.SplitHostPort(http)
		cmd.Env = append(os.Environ(),
			"GRPC_HOST="+gh, "GRPC_PORT="+gp, "DEBUG_HOST="+dh, "DEBUG_PORT="+dp, "HOST="+hh, "PORT="+hp,
			"USE_STATSD=false", "LOG_LEVEL=warn",
			"REDIS_SOCKET_TYPE=tcp", "REDIS_TYPE=SINGLE", "REDIS_URL="+s.redis.addr,
			"RUNTIME_ROOT="+filepath.Join(work, "runtime"), "RUNTIME_SUBDIRECTORY=ratelimit",
			"RUNTIME_APPDIRECTORY=config", "RUNTIME_WATCH_ROOT=false")
		s.notes = "envoyproxy/ratelimit " + o.refBin + " with its defaults (REDIS_POOL_SIZE 10, REDIS_PIPELINE_WINDOW 0), loopback only"
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return s, err
	}
	s.cmd = cmd
	if err := waitReady(addr); err != nil {
		b, _ := os.ReadFile(logf.Name())
		return s, fmt.Errorf("%w; its log:\n%s", err, b)
	}
	return s, nil
}

func startRedis(o options, work, name string) (*redisProc, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	_, port, _ := net.SplitHostPort(addr)
	dir := filepath.Join(work, "redis-"+name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	cmd := exec.Command(o.redisServer, "--bind", "127.0.0.1", "--port", port, "--save", "",
		"--appendonly", "no", "--dir", dir, "--protected-mode", "yes")
	logf, err := os.Create(filepath.Join(dir, "log"))
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &redisProc{cmd: cmd, addr: addr, client: redis.NewClient(&redis.Options{Addr: addr, PoolSize: 1})}
	deadline := time.Now().Add(10 * time.Second)
	for p.client.Ping(context.Background()).Err() != nil {
		if time.Now().After(deadline) {
			p.stop()
			return nil, fmt.Errorf("redis-server on %s did not answer PING", addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return p, nil
}

func (p *redisProc) stop() {
	_ = p.client.Close()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	_ = p.cmd.Wait()
}

func (s *system) stop() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = s.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = s.cmd.Process.Kill()
			<-done
		}
	}
	if s.redis != nil {
		s.redis.stop()
	}
}

// waitReady polls addr with a real call until it answers.
func waitReady(addr string) error {
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer cc.Close()
	client := rlsv3.NewRateLimitServiceClient(cc)
	req := &rlsv3.RateLimitRequest{Domain: loadDomain, Descriptors: []*commonv3.RateLimitDescriptor{{
		Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "user", Value: "ready"}}}}}
	deadline := time.Now().Add(30 * time.Second)
	var last error
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, last = client.ShouldRateLimit(ctx, req)
		cancel()
		if last == nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s did not answer within 30s: %v", addr, last)
}

// fetchProfile writes what url answers to path.
func fetchProfile(url, path string) error {
	resp, err := (&http.Client{Timeout: 5 * time.Minute}).Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// cpuMicros returns the user+system CPU of pid in µs.
func cpuMicros(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces: split after its ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("malformed /proc stat")
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0, errors.New("short /proc stat")
	}
	ut, err1 := strconv.ParseFloat(f[11], 64)
	st, err2 := strconv.ParseFloat(f[12], 64)
	if err1 != nil || err2 != nil {
		return 0, errors.New("malformed /proc stat times")
	}
	return (ut + st) * 1e6 / clockTicks, nil
}

// clockTicks is USER_HZ, 100 on every Linux architecture Go supports.
const clockTicks = 100

// redisSnap is what INFO says at one instant.
type redisSnap struct {
	cmdUsec  float64
	cpuUsec  float64
	reads    float64
	commands map[string][2]float64 // name -> calls, usec
}

func snapRedis(p *redisProc) (redisSnap, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	txt, err := p.client.Info(ctx, "commandstats", "cpu", "stats").Result()
	if err != nil {
		return redisSnap{}, err
	}
	s := redisSnap{commands: map[string][2]float64{}}
	sc := bufio.NewScanner(strings.NewReader(txt))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch {
		case strings.HasPrefix(k, "cmdstat_"):
			name := strings.TrimPrefix(k, "cmdstat_")
			var calls, usec float64
			for _, kv := range strings.Split(v, ",") {
				a, b, _ := strings.Cut(kv, "=")
				f, _ := strconv.ParseFloat(b, 64)
				switch a {
				case "calls":
					calls = f
				case "usec":
					usec = f
				}
			}
			if name == "info" || name == "ping" {
				continue // the bench's own
			}
			s.commands[name] = [2]float64{calls, usec}
			s.cmdUsec += usec
		case k == "used_cpu_user" || k == "used_cpu_sys":
			f, _ := strconv.ParseFloat(v, 64)
			s.cpuUsec += f * 1e6
		case k == "total_reads_processed":
			s.reads, _ = strconv.ParseFloat(v, 64)
		}
	}
	return s, nil
}

// procSnap is one instant of a server process and of the machine, for
// drive to take the difference of two.
type procSnap struct {
	cpu                float64 // µs of user+system CPU (cpuMicros)
	counts             procCounts
	idle, total, steal float64 // the machine's ticks (machineTicks)
}

func snapProc(pid int) (procSnap, error) {
	var ps procSnap
	var err error
	if ps.cpu, err = cpuMicros(pid); err != nil {
		return ps, err
	}
	if ps.counts, err = countsOf(pid); err != nil {
		return ps, err
	}
	ps.idle, ps.total, ps.steal, err = machineTicks()
	return ps, err
}

// procCounts is what the kernel counted for a process at one instant: the
// read and write system calls of its threads (/proc/<pid>/io syscr and
// syscw: every read, write, recvfrom and sendto, EAGAIN included, on
// sockets as on files) and their context switches (/proc/<pid>/task/*/status
// voluntary_ctxt_switches, a thread blocking: parked in a futex or in
// epoll_wait, plus nonvoluntary_ctxt_switches, one preempted).
type procCounts struct {
	reads, writes, switches float64
}

func countsOf(pid int) (procCounts, error) {
	var pc procCounts
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return pc, err
	}
	if pc.reads, err = procField(b, "syscr"); err != nil {
		return pc, err
	}
	if pc.writes, err = procField(b, "syscw"); err != nil {
		return pc, err
	}
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	if err != nil || len(tasks) == 0 {
		return pc, fmt.Errorf("no threads of %d: %v", pid, err)
	}
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue // a thread that has just exited
		}
		v, err1 := procField(b, "voluntary_ctxt_switches")
		n, err2 := procField(b, "nonvoluntary_ctxt_switches")
		if err1 != nil || err2 != nil {
			return pc, fmt.Errorf("%s: no context switch counts", t)
		}
		pc.switches += v + n
	}
	return pc, nil
}

// procField reads the value of a "name: value" line of a /proc file.
func procField(b []byte, name string) (float64, error) {
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok && strings.TrimSpace(k) == name {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	return 0, fmt.Errorf("no %s", name)
}

// machineTicks returns the machine's idle, total and stolen CPU ticks
// from the first line of /proc/stat: idle and iowait count as idle; steal
// is time the hypervisor gave another guest while this one wanted to run
// (it counts in the total).
func machineTicks() (idle, total, steal float64, err error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, 0, err
	}
	return parseStat(string(b))
}

func parseStat(txt string) (idle, total, steal float64, err error) {
	line, _, _ := strings.Cut(txt, "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0, 0, 0, errors.New("malformed /proc/stat")
	}
	// user nice system idle iowait irq softirq steal; guest time is
	// counted in user already.
	for i, s := range f[1:9] {
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return 0, 0, 0, errors.New("malformed /proc/stat")
		}
		total += v
		switch i {
		case 3, 4:
			idle += v
		case 7:
			steal = v
		}
	}
	return idle, total, steal, nil
}
