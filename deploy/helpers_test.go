package deploy_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// repoRoot is the envoy-rls repository, the parent of this module.
const repoRoot = ".."

func repoPath(p string) string { return filepath.Join(repoRoot, filepath.FromSlash(p)) }

func readRepoFile(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(repoPath(p))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The binary, built once per test process by the Dockerfile's own build
// command (dockerfile_test.go).
var (
	buildOnce    sync.Once
	builtBinary  string
	builtVersion string
	buildErr     error
)

// envoyRLS returns the path of the binary the Dockerfile builds.
func envoyRLS(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		builtBinary, builtVersion, buildErr = buildLikeDockerfile()
	})
	if buildErr != nil {
		t.Fatalf("building envoy-rls as the Dockerfile does: %v", buildErr)
	}
	return builtBinary
}

// buildDirPath holds the built binary for the whole test process.
var buildDirPath string

func buildDir() (string, error) {
	if buildDirPath == "" {
		d, err := os.MkdirTemp("", "envoy-rls-deploy-test-")
		if err != nil {
			return "", err
		}
		buildDirPath = d
	}
	return buildDirPath, nil
}

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDirPath != "" {
		os.RemoveAll(buildDirPath)
	}
	os.Exit(code)
}

// freePort returns a loopback port for a server started within the next
// minute. A port merely listened on and closed again is the next pick of
// another bind to port 0 about once in 7,000 (a test of another package
// running meanwhile, or the next call here): the server started on it then
// fails with "address already in use". So the port's side of a connection
// to it is left in TIME_WAIT, which keeps the kernel from picking it for
// anyone for a minute, while a server binding it explicitly with
// SO_REUSEADDR (Go's net.Listen, redis-server) may; and no port is handed
// out twice. The module's internal/testutil.FreePort does the same (this
// module cannot import it).
func freePort(t *testing.T) int {
	t.Helper()
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			l.Close()
			t.Fatal(err)
		}
		s, err := l.Accept()
		if err != nil {
			c.Close()
			l.Close()
			t.Fatal(err)
		}
		s.Close() // the port's side closes first: it stays in TIME_WAIT
		_, _ = io.Copy(io.Discard, c)
		c.Close()
		l.Close()
		handedOutMu.Lock()
		fresh := !handedOut[port]
		handedOut[port] = true
		handedOutMu.Unlock()
		if fresh {
			return port
		}
	}
	t.Fatal("no free port that was not handed out already")
	return 0
}

var (
	handedOutMu sync.Mutex
	handedOut   = map[int]bool{}
)

// startRedis starts a private redis-server on a free loopback port and
// returns its address.
func startRedis(t *testing.T) string {
	t.Helper()
	port := freePort(t)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	cmd := exec.Command("redis-server", "--port", fmt.Sprint(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no")
	cmd.Dir = t.TempDir()
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("redis-server: %v", err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.SetDeadline(time.Now().Add(2 * time.Second))
			fmt.Fprint(c, "PING\r\n")
			line, _ := bufio.NewReader(c).ReadString('\n')
			c.Close()
			if strings.HasPrefix(line, "+PONG") {
				return addr
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis-server on %s did not answer PING:\n%s", addr, out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// configMapDir lays out data as the kubelet mounts a ConfigMap volume: the
// files live in a timestamped directory, `..data` links to it, and each key
// is a link through `..data`. Everything is readable by any user.
func configMapDir(t *testing.T, data map[string]string) string {
	t.Helper()
	dir := worldReadableTempDir(t)
	ts := "..2026_12_01_00_00_00.000000001"
	if err := os.Mkdir(filepath.Join(dir, ts), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range data {
		if err := os.WriteFile(filepath.Join(dir, ts, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(ts, filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	return dir
}

// updateConfigMapDir changes a configMapDir as the kubelet applies a
// ConfigMap update: the new files go into a new timestamped directory,
// links for new keys are added, and `..data` is swapped to it atomically
// (a new link renamed over the old one).
func updateConfigMapDir(t *testing.T, dir string, data map[string]string) {
	t.Helper()
	ts := "..2026_12_01_00_00_01.000000002"
	if err := os.Mkdir(filepath.Join(dir, ts), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range data {
		if err := os.WriteFile(filepath.Join(dir, ts, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(ts, filepath.Join(dir, "..data_tmp")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	for name := range data {
		link := filepath.Join(dir, name)
		if _, err := os.Lstat(link); err == nil {
			continue
		}
		if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
			t.Fatal(err)
		}
	}
}

// worldReadableTempDir is a t.TempDir that other users (uid 65534) can
// enter: t.TempDir's directories are 0700.
func worldReadableTempDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for d := dir; d != os.TempDir() && d != "/" && d != "."; d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// checkConfig runs `envoy-rls check-config --config path` and fails the test
// with its output unless it exits 0.
func checkConfig(t *testing.T, path string) {
	t.Helper()
	out, err := exec.Command(envoyRLS(t), "check-config", "--config", path).CombinedOutput()
	if err != nil {
		t.Fatalf("envoy-rls check-config --config %s: %v\n%s", path, err, out)
	}
}

// flagDefaults parses `envoy-rls serve -h` into flag name -> default value
// (empty when the help shows none).
func flagDefaults(t *testing.T) map[string]string {
	t.Helper()
	cmd := exec.Command(envoyRLS(t), "serve", "-h")
	out, _ := cmd.CombinedOutput() // -h may exit 0 or 2
	flags := map[string]string{}
	nameRE := regexp.MustCompile(`^\s+-(-?)([a-z0-9-]+)`)
	// Go's flag package prints `(default "x")`; envoy-rls prints
	// `(env ENVOY_RLS_X, default "x")`.
	defRE := regexp.MustCompile(`default:? "([^"]*)"|\(default ([^)"]*)\)`)
	var last string
	for line := range strings.SplitSeq(string(out), "\n") {
		if m := nameRE.FindStringSubmatch(line); m != nil && !strings.HasPrefix(strings.TrimSpace(line), "-- ") {
			last = m[2]
			flags[last] = ""
		}
		if m := defRE.FindStringSubmatch(line); m != nil && last != "" {
			flags[last] = m[1] + m[2]
		}
	}
	if len(flags) == 0 {
		t.Fatalf("envoy-rls serve -h lists no flags:\n%s", out)
	}
	return flags
}

// flagValue returns the value of --name in args (--name=v or --name v) and
// whether it is there.
func flagValue(args []string, name string) (string, bool) {
	for i, a := range args {
		for _, p := range []string{"--" + name, "-" + name} {
			if a == p && i+1 < len(args) {
				return args[i+1], true
			}
			if v, ok := strings.CutPrefix(a, p+"="); ok {
				return v, true
			}
		}
	}
	return "", false
}

// setFlag returns args with --name's value replaced (or appended).
func setFlag(args []string, name, value string) []string {
	out := append([]string(nil), args...)
	for i, a := range out {
		for _, p := range []string{"--" + name, "-" + name} {
			if a == p && i+1 < len(out) {
				out[i+1] = value
				return out
			}
			if strings.HasPrefix(a, p+"=") {
				out[i] = p + "=" + value
				return out
			}
		}
	}
	return append(out, "--"+name+"="+value)
}

// checkFlagsExist fails the test for every --flag in args that `envoy-rls
// serve -h` does not list.
func checkFlagsExist(t *testing.T, where string, args []string) {
	t.Helper()
	known := flagDefaults(t)
	for _, a := range args {
		if !strings.HasPrefix(a, "-") {
			continue
		}
		name := strings.TrimLeft(a, "-")
		name, _, _ = strings.Cut(name, "=")
		if _, ok := known[name]; !ok {
			t.Errorf("%s: envoy-rls serve has no flag %q", where, a)
		}
	}
}

// process is a started envoy-rls.
type process struct {
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
	err  error // set when done is closed
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// start runs cmd and stops it (SIGTERM, then SIGKILL) at cleanup.
func start(t *testing.T, cmd *exec.Cmd) *process {
	t.Helper()
	p := &process{cmd: cmd, out: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", cmd.Path, err)
	}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
			return
		default:
		}
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(15 * time.Second):
			cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// waitHTTP polls url until it answers 200, failing if the process exits or
// a minute passes (the machine may be very busy).
func (p *process) waitHTTP(t *testing.T, url string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	var last string
	for {
		select {
		case <-p.done:
			t.Fatalf("envoy-rls exited (%v) before %s answered; output:\n%s", p.err, url, p.out.String())
		default:
		}
		resp, err := http.Get(url)
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, body)
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not answer 200 within a minute (last: %s); output:\n%s", url, last, p.out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// entry is one (key, value) of a rate limit descriptor.
type entry struct{ Key, Value string }

// limitFor sends one descriptor to envoy-rls's POST /json and reports
// whether a rate limit applied to it (the status names a current limit).
func limitFor(t *testing.T, httpAddr, domain string, entries []entry) bool {
	t.Helper()
	type jsonEntry struct {
		Key   string `json:"key"`
		Value string `json:"value"`
	}
	var es []jsonEntry
	for _, e := range entries {
		es = append(es, jsonEntry(e))
	}
	body, err := json.Marshal(map[string]any{
		"domain":      domain,
		"descriptors": []any{map[string]any{"entries": es}},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+httpAddr+"/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("POST /json %s: %d %s", body, resp.StatusCode, raw)
	}
	var out struct {
		Statuses []struct {
			CurrentLimit *struct {
				RequestsPerUnit uint32 `json:"requestsPerUnit"`
			} `json:"currentLimit"`
		} `json:"statuses"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("POST /json answer %s: %v", raw, err)
	}
	if len(out.Statuses) != 1 {
		t.Fatalf("POST /json %s: want 1 status, got %s", body, raw)
	}
	return out.Statuses[0].CurrentLimit != nil
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// stop sends SIGTERM and waits for the exit; it fails the test unless the
// process exits 0.
func (p *process) stop(t *testing.T) {
	t.Helper()
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("no exit 30s after SIGTERM; output:\n%s", p.out.String())
	}
	if p.err != nil {
		t.Fatalf("exit after SIGTERM: %v; output:\n%s", p.err, p.out.String())
	}
}
