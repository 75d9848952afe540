package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/envoyrls/envoy-rls/internal/redistest"
	"github.com/envoyrls/envoy-rls/internal/testutil"
)

// configMapDir lays out dir as the kubelet mounts a ConfigMap: each key a
// symlink into ..data, which points at a timestamped directory; publish
// swaps ..data atomically.
type configMapDir struct {
	dir string
	n   int
}

func (c *configMapDir) publish(t *testing.T, files map[string]string) {
	t.Helper()
	c.n++
	version := fmt.Sprintf("..2026_12_01_00_00_%02d.%d", c.n, c.n)
	if err := os.MkdirAll(filepath.Join(c.dir, version), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range files {
		writeFile(t, filepath.Join(c.dir, version, name), content)
	}
	tmp := filepath.Join(c.dir, "..data_tmp")
	if err := os.Symlink(version, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(c.dir, "..data")); err != nil {
		t.Fatal(err)
	}
	for name := range files {
		link := filepath.Join(c.dir, name)
		if _, err := os.Lstat(link); os.IsNotExist(err) {
			if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
				t.Fatal(err)
			}
		}
	}
}

const istioConfigV1 = `domain: ratelimit
descriptors:
  - key: PATH
    value: "/productpage"
    rate_limit:
      unit: hour
      requests_per_unit: 1
  - key: PATH
    rate_limit:
      unit: hour
      requests_per_unit: 100
`

const istioConfigV2 = `domain: ratelimit
descriptors:
  - key: PATH
    value: "/productpage"
    rate_limit:
      unit: hour
      requests_per_unit: 1
  - key: PATH
    value: "/reviews"
    rate_limit:
      unit: hour
      requests_per_unit: 2
`

// startReference starts the binary with no arguments and env (plus PATH and
// loopback listeners on free ports), waits for /healthcheck, and returns it
// with the debug listener's URL.
func startReference(t *testing.T, env []string) (*proc, string) {
	t.Helper()
	return startReferenceHealth(t, 200, env)
}

// startReferenceHealth is startReference waiting until /healthcheck answers
// health.
func startReferenceHealth(t *testing.T, health int, env []string) (*proc, string) {
	t.Helper()
	clearOfHourEnd(t)
	grpcPort, httpPort, debugPort := testutil.FreePort(t), testutil.FreePort(t), testutil.FreePort(t)
	p := &proc{grpcAddr: fmt.Sprintf("127.0.0.1:%d", grpcPort), httpURL: fmt.Sprintf("http://127.0.0.1:%d", httpPort), exited: make(chan struct{})}
	p.cmd = exec.Command(binary)
	p.cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"),
		"HOST=127.0.0.1", fmt.Sprintf("PORT=%d", httpPort), "GRPC_HOST=127.0.0.1", fmt.Sprintf("GRPC_PORT=%d", grpcPort),
		"DEBUG_HOST=127.0.0.1", fmt.Sprintf("DEBUG_PORT=%d", debugPort)}, env...)
	startProc(t, p)
	testutil.WaitEvery(t, procPoll, 30*time.Second, fmt.Sprintf("/healthcheck %d", health), func() bool {
		select {
		case <-p.exited:
			t.Fatalf("envoy-rls exited:\n%s", p.Logs())
		default:
		}
		code, _ := httpGetCode(p.httpURL + "/healthcheck")
		return code == health
	})
	var err error
	p.conn, err = grpc.NewClient(p.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.conn.Close() })
	return p, fmt.Sprintf("http://127.0.0.1:%d", debugPort)
}

func (p *proc) expectCodes(t *testing.T, domain string, kv []string, want ...rlsv3.RateLimitResponse_Code) {
	t.Helper()
	for i, w := range want {
		resp, err := p.client().ShouldRateLimit(ctxT(t), &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*commonv3.RateLimitDescriptor{descriptor(kv...)}})
		if err != nil || resp.OverallCode != w {
			t.Fatalf("%v call %d: %v %v, want %v", kv, i+1, resp.GetOverallCode(), err, w)
		}
	}
}

// TestIstioSample runs the binary as Istio's sample does: no arguments,
// the sample's environment, the config from a ConfigMap mounted at
// RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config; a ConfigMap update (the ..data
// swap) reloads it.
func TestIstioSample(t *testing.T) {
	if testing.Short() {
		t.Skip("process-heavy")
	}
	root := filepath.Join(t.TempDir(), "data")
	cm := &configMapDir{dir: filepath.Join(root, "ratelimit", "config")}
	cm.publish(t, map[string]string{"config.yaml": istioConfigV1})
	rdb := redistest.StartStandalone(t)
	p, debugURL := startReference(t, []string{
		"LOG_LEVEL=debug", "REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + rdb.Addr(), "USE_STATSD=false",
		"RUNTIME_ROOT=" + root, "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false", "RUNTIME_IGNOREDOTFILES=true",
	})
	ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	p.expectCodes(t, "ratelimit", []string{"PATH", "/productpage"}, ok, over)
	p.expectCodes(t, "ratelimit", []string{"PATH", "/reviews"}, ok, ok, ok)

	cm.publish(t, map[string]string{"config.yaml": istioConfigV2})
	testutil.WaitEvery(t, procPoll, 30*time.Second, "the ConfigMap update in /rlconfig", func() bool {
		_, body := httpGetCode(debugURL + "/rlconfig")
		return strings.Contains(body, "ratelimit.PATH_/reviews: unit=HOUR requests_per_unit=2")
	})
	// The unchanged limit kept its counter. /reviews keeps its usage too
	// (3 hits, counted per descriptor and window as the reference does),
	// so its new limit of 2 per hour denies at once.
	p.expectCodes(t, "ratelimit", []string{"PATH", "/productpage"}, over)
	p.expectCodes(t, "ratelimit", []string{"PATH", "/reviews"}, over, over)
}

// With RUNTIME_WATCH_ROOT=true (the reference's default), replacing
// RUNTIME_ROOT itself (a symlink swapped to a new tree) reloads.
func TestRuntimeWatchRoot(t *testing.T) {
	if testing.Short() {
		t.Skip("process-heavy")
	}
	base := t.TempDir()
	for i, cfg := range []string{istioConfigV1, istioConfigV2} {
		dir := filepath.Join(base, fmt.Sprintf("v%d", i+1), "ratelimit", "config")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(dir, "config.yaml"), cfg)
	}
	root := filepath.Join(base, "current")
	if err := os.Symlink("v1", root); err != nil {
		t.Fatal(err)
	}
	rdb := redistest.StartStandalone(t)
	p, debugURL := startReference(t, []string{
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + rdb.Addr(), "USE_STATSD=false",
		"RUNTIME_ROOT=" + root, "RUNTIME_SUBDIRECTORY=ratelimit",
	})
	p.expectCodes(t, "ratelimit", []string{"PATH", "/reviews"}, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK)
	tmp := filepath.Join(base, "current_tmp")
	if err := os.Symlink("v2", tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, root); err != nil {
		t.Fatal(err)
	}
	testutil.WaitEvery(t, procPoll, 30*time.Second, "the root swap in /rlconfig", func() bool {
		_, body := httpGetCode(debugURL + "/rlconfig")
		return strings.Contains(body, "ratelimit.PATH_/reviews: unit=HOUR requests_per_unit=2")
	})
	// A later edit inside the new tree reloads too.
	writeFile(t, filepath.Join(base, "v2", "ratelimit", "config", "config.yaml"), strings.Replace(istioConfigV2, "requests_per_unit: 2", "requests_per_unit: 7", 1))
	testutil.WaitEvery(t, procPoll, 30*time.Second, "the edit in the new tree in /rlconfig", func() bool {
		_, body := httpGetCode(debugURL + "/rlconfig")
		return strings.Contains(body, "ratelimit.PATH_/reviews: unit=HOUR requests_per_unit=7")
	})
}
