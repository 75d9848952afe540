package deploy_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
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
