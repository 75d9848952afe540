// Package integration tests the built envoy-rls binary as a black box: it
// builds cmd/envoy-rls once, starts it as a process on free loopback ports and
// drives it over gRPC and HTTP, like Envoy and a user with curl would.
package integration

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/envoyrls/envoy-rls/internal/testutil"
)

// binary is the envoy-rls binary built for this test run.
var binary string

// buildRace builds the binary with the race detector (as CI does); make
// failmodes measures a normal build.
var buildRace = flag.Bool("build-race", true, "build envoy-rls with -race")

var httpClient = &http.Client{Timeout: 10 * time.Second}

// procPoll is how often a wait asks a process (over HTTP or gRPC) whether
// its condition holds.
const procPoll = 20 * time.Millisecond

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		// Every test here runs the built binary as a process: none belongs
		// to the short tier (go test -short); make test runs them.
		fmt.Println("test/integration: needs the built binary; skipped with -short")
		os.Exit(0)
	}
	dir, err := os.MkdirTemp("", "envoy-rls-it")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "envoy-rls")
	args := []string{"build", "-o", binary}
	if *buildRace {
		args = append(args, "-race")
	}
	build := exec.Command("go", append(args, "../../cmd/envoy-rls")...)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building envoy-rls:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// proc is a running envoy-rls.
type proc struct {
	cmd      *exec.Cmd
	grpcAddr string
	httpURL  string
	mu       sync.Mutex
	log      bytes.Buffer
	exited   chan struct{}
	conn     *grpc.ClientConn
}

// Logs returns what the process logged so far.
func (p *proc) Logs() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.String()
}

// startServe runs `envoy-rls serve` with args (plus listen addresses on free
// ports) and env, and waits until /healthz answers 200.
func startServe(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	return startServeHealth(t, 200, env, args...)
}

// startServeUnready is startServe for a service that is expected not to be
// healthy yet (its Redis never answered): it waits until /healthz answers
// 503.
func startServeUnready(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	return startServeHealth(t, 503, env, args...)
}

func startServeHealth(t *testing.T, health int, env []string, args ...string) *proc {
	t.Helper()
	return startBinary(t, binary, health, env, args...)
}

// clearOfHourEnd waits, when the next hour begins within a minute, until it
// has begun (see testutil.ClearOfHourEnd): most tests here count hits in
// fixed windows of an hour or a day (their configs say unit: hour, as
// Istio's sample and Envoy Gateway's do). The longest test takes 32 s under
// -race on a loaded 2-core machine, its longest part from one start of
// envoy-rls 12 s.
func clearOfHourEnd(t *testing.T) {
	t.Helper()
	testutil.ClearOfHourEnd(t)
}

// startBinary is startServeHealth for the envoy-rls binary at bin.
func startBinary(t *testing.T, bin string, health int, env []string, args ...string) *proc {
	t.Helper()
	clearOfHourEnd(t)
	grpcAddr := fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t))
	httpAddr := fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t))
	p := &proc{grpcAddr: grpcAddr, httpURL: "http://" + httpAddr, exited: make(chan struct{})}
	full := append([]string{"serve", "--grpc-addr", grpcAddr, "--http-addr", httpAddr}, args...)
	p.cmd = exec.Command(bin, full...)
	p.cmd.Env = append(os.Environ(), env...)
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	p.cmd.Stdout = io.Discard
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			p.mu.Lock()
			p.log.WriteString(sc.Text() + "\n")
			p.mu.Unlock()
		}
		p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-p.exited
		if t.Failed() {
			t.Logf("envoy-rls log:\n%s", p.Logs())
		}
	})
	testutil.WaitEvery(t, procPoll, 20*time.Second, fmt.Sprintf("envoy-rls /healthz %d", health), func() bool {
		select {
		case <-p.exited:
			t.Fatalf("envoy-rls exited early:\n%s", p.Logs())
		default:
		}
		resp, err := httpClient.Get(p.httpURL + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == health
	})
	p.conn, err = grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.conn.Close() })
	return p
}

func (p *proc) client() rlsv3.RateLimitServiceClient { return rlsv3.NewRateLimitServiceClient(p.conn) }

// stop sends SIGTERM, waits for the exit and returns the exit code.
func (p *proc) stop(t *testing.T) int {
	t.Helper()
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(15 * time.Second):
		t.Fatal("envoy-rls did not exit within 15s of SIGTERM")
		return -1
	}
}

// postJSON posts body to /json and returns the status code and body.
func (p *proc) postJSON(t *testing.T, body string) (int, string) {
	t.Helper()
	resp, err := httpClient.Post(p.httpURL+"/json", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// repoFile returns the path of a file of the repository.
func repoFile(parts ...string) string {
	return filepath.Join(append([]string{"..", ".."}, parts...)...)
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}
