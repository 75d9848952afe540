package integration

// What a new user meets in the first ten minutes, checked on the built
// binary: help on stdout, short and exact error messages that name the
// flag or variable and the format wanted, the version, YAML errors at the
// right line, Redis selected by its flags, health that reflects Redis,
// backend failures summarised while they last, unknown domains and
// unmatched descriptors visible, and the end of shutdown logged.

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/envoyrls/envoy-rls/internal/redistest"
	"github.com/envoyrls/envoy-rls/internal/testutil"
)

// runBinary runs envoy-rls with args and extra environment, and returns
// its stdout, stderr and exit code.
func runBinary(t *testing.T, env []string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		t.Fatal(err)
	}
	return stdout.String(), stderr.String(), code
}

// TestHelpOnStdout: -h of every command prints its usage on stdout (so it
// can be piped to grep) and exits 0.
func TestHelpOnStdout(t *testing.T) {
	for _, tc := range []struct {
		args   []string
		prefix string
		has    string
	}{
		{[]string{"-h"}, "envoy-rls: Envoy's external rate limit service.\n", "envoy-rls version"},
		{[]string{"serve", "-h"}, "Usage:\n  envoy-rls serve --config PATH [flags]\n", "  --redis-url (env ENVOY_RLS_REDIS_URL)\n"},
		{[]string{"serve", "--help"}, "Usage:\n  envoy-rls serve --config PATH [flags]\n", "  --backend-timeout (env ENVOY_RLS_BACKEND_TIMEOUT), default \"1s\"\n"},
		{[]string{"check-config", "-h"}, "Usage:\n  envoy-rls check-config --config PATH [--config-recursive]", "  --merge-domain-config (env ENVOY_RLS_MERGE_DOMAIN_CONFIG)"},
		{[]string{"version", "-h"}, "Usage:\n  envoy-rls version\n", "Prints the version"},
	} {
		stdout, stderr, code := runBinary(t, nil, tc.args...)
		if code != 0 || stderr != "" || !strings.HasPrefix(stdout, tc.prefix) || !strings.Contains(stdout, tc.has) {
			t.Errorf("envoy-rls %s: exit %d, stderr %q, stdout:\n%s", strings.Join(tc.args, " "), code, stderr, stdout)
		}
	}
	// version -h is help, not the version.
	if stdout, _, _ := runBinary(t, nil, "version", "-h"); strings.HasPrefix(stdout, "envoy-rls ") {
		t.Errorf("version -h printed the version: %q", stdout)
	}
}

// TestErrorMessages: a mistake on the command line or in the environment
// gives one line that names the flag (--name) or variable and what is
// wanted, then one line saying where the help is. Exit code 2.
func TestErrorMessages(t *testing.T) {
	cfg := repoFile("examples", "ratelimit.yaml")
	const serveHint = "Run \"envoy-rls serve -h\" for usage.\n"
	const duration = "want a Go duration such as 250ms, 1.5s or 2m (a number with a unit: ns, us, ms, s, m, h)"
	for _, tc := range []struct {
		env  []string
		args []string
		want string
	}{
		{nil, []string{"serve", "--bakend", "redis"},
			"envoy-rls serve: unknown flag --bakend (did you mean --backend?)\n" + serveHint},
		{nil, []string{"serve", "--config", cfg, "--backend-timeout", "abc"},
			"envoy-rls serve: --backend-timeout \"abc\": " + duration + "\n" + serveHint},
		{nil, []string{"serve", "--config", cfg, "-backend-timeout=10"},
			"envoy-rls serve: --backend-timeout \"10\": " + duration + "\n" + serveHint},
		{[]string{"ENVOY_RLS_BACKEND_TIMEOUT=abc"}, []string{"serve", "--config", cfg},
			"envoy-rls serve: ENVOY_RLS_BACKEND_TIMEOUT=\"abc\" (--backend-timeout): " + duration + "\n" + serveHint},
		{[]string{"ENVOY_RLS_WATCH_CONFIG=sometimes"}, []string{"serve", "--config", cfg},
			"envoy-rls serve: ENVOY_RLS_WATCH_CONFIG=\"sometimes\" (--watch-config): want true or false\n" + serveHint},
		{nil, []string{"serve", "--config"},
			"envoy-rls serve: --config needs a value\n" + serveHint},
		{nil, []string{"serve", cfg},
			"envoy-rls serve: unexpected argument \"" + cfg + "\" (did you mean --config " + cfg + "?)\n" + serveHint},
		{nil, []string{"serv"},
			"envoy-rls: unknown command \"serv\" (did you mean serve?)\nRun \"envoy-rls -h\" for usage.\n"},
		{nil, []string{"check-config", "--confg", cfg},
			"envoy-rls check-config: unknown flag --confg (did you mean --config?)\nRun \"envoy-rls check-config -h\" for usage.\n"},
	} {
		stdout, stderr, code := runBinary(t, tc.env, tc.args...)
		if code != 2 || stdout != "" || stderr != tc.want {
			t.Errorf("%v envoy-rls %s: exit %d, stdout %q\n got  %q\n want %q", tc.env, strings.Join(tc.args, " "), code, stdout, stderr, tc.want)
		}
	}
}

// TestVersion: `version` reports the version given with -ldflags, the
// commit and time of the checkout the binary was built from (VCS stamping)
// and the Go version.
func TestVersion(t *testing.T) {
	out := filepath.Join(t.TempDir(), "envoy-rls")
	build := exec.Command("go", "build", "-buildvcs=true", "-ldflags", "-X main.version=9.9.9-test", "-o", out, "../../cmd/envoy-rls")
	if msg, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, msg)
	}
	head, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		t.Fatal(err)
	}
	got, err := exec.Command(out, "version").Output()
	if err != nil {
		t.Fatal(err)
	}
	// Go stamps the commit in a clone; it records none in a git worktree
	// (a .git file), where the line must then not claim one.
	info, err := exec.Command("go", "version", "-m", out).Output()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(info), "vcs.revision=") {
		want := regexp.MustCompile(`^envoy-rls 9\.9\.9-test \(go1\.\d+\S* \w+/\w+\)\n$`)
		if !want.Match(got) {
			t.Fatalf("version without VCS information: %q", got)
		}
		t.Logf("no VCS information recorded (a git worktree?): %q", got)
		return
	}
	re := regexp.MustCompile(`^envoy-rls 9\.9\.9-test \(commit ([0-9a-f]{12})( with local changes)?, \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ, go1\.\d+\S* \w+/\w+\)\n$`)
	m := re.FindStringSubmatch(string(got))
	if m == nil || !strings.HasPrefix(string(head), m[1]) {
		t.Fatalf("version: %q, want the version, commit %.12s and Go version", got, head)
	}
}

// TestCheckConfigYAMLLines: a syntax error is reported at the line it is on
// (yaml.v3 alone names the line where the enclosing block starts).
func TestCheckConfigYAMLLines(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, content, want string
	}{
		{"indent.yaml", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 5\n     name: x\n",
			":7: invalid YAML: did not find expected key\n"},
		{"tab.yaml", "domain: d\ndescriptors:\n  - key: a\n\trate_limit: {unit: second, requests_per_unit: 5}\n",
			":4: invalid YAML: found a tab character that violates indentation (indent with spaces)\n"},
	} {
		file := filepath.Join(dir, tc.name)
		writeFile(t, file, tc.content)
		stdout, stderr, code := runBinary(t, nil, "check-config", "--config", file)
		if code != 1 || stdout != "" || stderr != file+tc.want {
			t.Errorf("%s: exit %d, stdout %q\n got  %q\n want %q", tc.name, code, stdout, stderr, file+tc.want)
		}
	}
}

// TestRedisURLSelectsRedis: --redis-url alone (here in the reference's
// host:port form) selects the Redis backend: two instances share its
// counters exactly. --backend memory with it is an error that says so.
func TestRedisURLSelectsRedis(t *testing.T) {
	srv := redistest.StartStandalone(t)
	cfg := filepath.Join(t.TempDir(), "exact.yaml")
	writeFile(t, cfg, exactYAML)
	a := startServe(t, nil, "--config", cfg, "--redis-url", srv.Addr(), "--backend-timeout", "2s")
	b := startServe(t, []string{"ENVOY_RLS_REDIS_URL=" + srv.Addr(), "ENVOY_RLS_BACKEND_TIMEOUT=2s"}, "--config", cfg)
	if n := hammer(t, []*proc{a, b}, 8, 10, "fixed_window", "shared"); n != 40 {
		t.Fatalf("two instances on --redis-url %s allowed %d of 80, want exactly 40 (one shared counter)", srv.Addr(), n)
	}
	for _, p := range []*proc{a, b} {
		testutil.WaitEvery(t, procPoll, 10*time.Second, "serving line", func() bool { return strings.Contains(p.Logs(), `msg="envoy-rls serving"`) })
		if !strings.Contains(p.Logs(), " backend=redis ") {
			t.Errorf("start-up line does not say backend=redis:\n%s", p.Logs())
		}
	}
	for _, tc := range []struct {
		env  []string
		args []string
		want string
	}{
		{nil, []string{"--backend", "memory", "--redis-url", srv.Addr()},
			"envoy-rls serve: --redis-url needs the redis backend, but --backend is \"memory\": drop --backend (then --redis-url selects Redis) or drop --redis-url\n"},
		{[]string{"ENVOY_RLS_BACKEND=memory"}, []string{"--redis-cluster", srv.Addr()},
			"envoy-rls serve: --redis-cluster needs the redis backend, but ENVOY_RLS_BACKEND (--backend) is \"memory\": drop --backend (then --redis-cluster selects Redis) or drop --redis-cluster\n"},
		{nil, []string{"--redis-pool-size", "5"},
			"envoy-rls serve: --redis-pool-size applies to the redis backend, which needs --redis-url, --redis-sentinel or --redis-cluster\n"},
		{nil, []string{"--redis-url", srv.Addr(), "--failure-mode", "deny", "--max-keys", "10"},
			"envoy-rls serve: --max-keys applies to the memory backend and to the fallback store of --failure-mode local; the backend is redis (selected by --redis-url) and the failure mode deny keeps no store\n"},
	} {
		args := append([]string{"serve", "--config", cfg}, tc.args...)
		stdout, stderr, code := runBinary(t, tc.env, args...)
		want := tc.want + "Run \"envoy-rls serve -h\" for usage.\n"
		if code != 2 || stdout != "" || stderr != want {
			t.Errorf("%v %v: exit %d\n got  %q\n want %q", tc.env, tc.args, code, stderr, want)
		}
	}
}

// TestHealthWaitsForRedis: while the configured Redis has never answered,
// /healthz is 503 with the reason and gRPC health NOT_SERVING; once it
// answers both turn healthy.
func TestHealthWaitsForRedis(t *testing.T) {
	srv := redistest.StartStandalone(t)
	srv.Stop()
	cfg := filepath.Join(t.TempDir(), "exact.yaml")
	writeFile(t, cfg, exactYAML)
	p := startServeUnready(t, nil, "--config", cfg, "--redis-url", srv.URL())
	// The first check runs at start-up: poll until its answer is in.
	var code int
	var body string
	testutil.WaitEvery(t, procPoll, 10*time.Second, "/healthz naming the cause", func() bool {
		resp, err := httpClient.Get(p.httpURL + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		b := new(bytes.Buffer)
		b.ReadFrom(resp.Body)
		resp.Body.Close()
		code, body = resp.StatusCode, b.String()
		return strings.Contains(body, "connection refused")
	})
	if code != 503 || !strings.HasPrefix(body, "redis not reachable yet: ") {
		t.Fatalf("/healthz while Redis was never reachable: %d %q", code, body)
	}
	h, err := healthpb.NewHealthClient(p.conn).Check(ctxT(t), &healthpb.HealthCheckRequest{Service: "envoy.service.ratelimit.v3.RateLimitService"})
	if err != nil || h.Status != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("gRPC health while Redis was never reachable: %v %v", h, err)
	}
	testutil.WaitEvery(t, procPoll, 10*time.Second, "log line saying Redis is not reachable", func() bool {
		return strings.Contains(p.Logs(), `msg="redis not reachable yet; /healthz and gRPC health answer not serving until it is"`)
	})
	srv.Restart()
	testutil.WaitEvery(t, procPoll, 15*time.Second, "/healthz 200 once Redis is up", func() bool {
		resp, err := httpClient.Get(p.httpURL + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	h, err = healthpb.NewHealthClient(p.conn).Check(ctxT(t), &healthpb.HealthCheckRequest{Service: "envoy.service.ratelimit.v3.RateLimitService"})
	if err != nil || h.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("gRPC health once Redis answered: %v %v", h, err)
	}
	if !strings.Contains(p.Logs(), `msg="redis reachable"`) {
		t.Errorf("no log line when Redis became reachable:\n%s", p.Logs())
	}
}

// TestBackendFailureSummaries: while Redis is down, a summary with the count
// and the cause comes every --backend-failure-log-interval, and a line says
// when it answers again.
func TestBackendFailureSummaries(t *testing.T) {
	// deny: the store returns each failure; local (the default): the
	// embedded store decides and the Redis store reports each fallback.
	for _, mode := range []string{"deny", "local"} {
		t.Run(mode, func(t *testing.T) { testBackendFailureSummaries(t, mode) })
	}
}

func testBackendFailureSummaries(t *testing.T, mode string) {
	srv := redistest.StartStandalone(t)
	cfg := filepath.Join(t.TempDir(), "exact.yaml")
	writeFile(t, cfg, exactYAML)
	p := startServe(t, nil, "--config", cfg, "--redis-url", srv.URL(), "--failure-mode", mode,
		"--backend-failure-log-interval", "300ms", "--backend-timeout", "50ms")
	req := &rlsv3.RateLimitRequest{Domain: "exact", Descriptors: []*commonv3.RateLimitDescriptor{descriptor("fixed_window", "x")}}
	call := func() {
		_, err := p.client().ShouldRateLimit(ctxT(t), req)
		if err != nil && (mode != "deny" || status.Code(err) != codes.Unavailable) {
			t.Fatalf("--failure-mode %s answered %v", mode, err)
		}
	}
	call()
	srv.Stop()
	summaries := regexp.MustCompile(`msg="rate limit backend still failing" failures=\d+ succeeded=\d+ in_last=300ms causes="[^"]*(connection refused|timed out)`)
	testutil.WaitEvery(t, procPoll, 20*time.Second, "two failure summaries", func() bool {
		call()
		return len(summaries.FindAllString(p.Logs(), -1)) >= 2
	})
	if !strings.Contains(p.Logs(), `msg="rate limit backend failed" cause=`) {
		t.Fatalf("no first failure line:\n%s", p.Logs())
	}
	srv.Restart()
	testutil.WaitEvery(t, procPoll, 20*time.Second, "recovery line", func() bool {
		call()
		return strings.Contains(p.Logs(), `msg="rate limit backend recovered" failures=`)
	})
}

// TestUnknownDomainAndUnmatchedDescriptor: a request for a domain the
// config lacks, or a descriptor no rule matches, is allowed, counted in
// /metrics and logged at debug level.
func TestUnknownDomainAndUnmatchedDescriptor(t *testing.T) {
	p := startServe(t, nil, "--config", repoFile("examples", "ratelimit.yaml"), "--log-level", "debug")
	for i := 0; i < 3; i++ {
		if code, _ := p.postJSON(t, `{"domain":"exampel","descriptors":[{"entries":[{"key":"path","value":"/x"}]}]}`); code != 200 {
			t.Fatalf("unknown domain: HTTP %d", code)
		}
	}
	if code, _ := p.postJSON(t, `{"domain":"example","descriptors":[{"entries":[{"key":"no_such_key","value":"v"}]}]}`); code != 200 {
		t.Fatalf("unmatched descriptor: HTTP %d", code)
	}
	metrics, err := httpGet(p.httpURL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"\nenvoy_rls_unknown_domain_requests_total 3\n", "\nenvoy_rls_unmatched_descriptors_total{domain=\"example\"} 1\n"} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q", strings.TrimSpace(want))
		}
	}
	testutil.WaitEvery(t, procPoll, 10*time.Second, "debug lines", func() bool {
		l := p.Logs()
		return strings.Contains(l, `level=DEBUG msg="unknown domain: allowed without limits" domain=exampel`) &&
			strings.Contains(l, `level=DEBUG msg="descriptor matches no rule: allowed without limit" domain=example descriptor="no_such_key=v"`)
	})
}

// TestShutdownLogged: SIGTERM logs the start and the end of the shutdown.
func TestShutdownLogged(t *testing.T) {
	p := startServe(t, nil, "--config", repoFile("examples", "ratelimit.yaml"))
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	// The log pipe is read to its end before exited is closed.
	logs := p.Logs()
	i, j := strings.Index(logs, `msg="shutting down"`), strings.Index(logs, `msg="shutdown complete"`)
	if i < 0 || j < i {
		t.Fatalf("want shutting down, then shutdown complete:\n%s", logs)
	}
}

// TestUnknownEnvironmentVariableWarned: an ENVOY_RLS_* variable that names
// no flag is not silently ignored: serve names it (and the variable it
// probably meant) on stderr before starting. Kubernetes' service-link
// variables for a Service named envoy-rls are not warned about.
func TestUnknownEnvironmentVariableWarned(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing.yaml")
	env := []string{"ENVOY_RLS_BAKEND=redis", "ENVOY_RLS_SERVICE_HOST=10.0.0.1", "ENVOY_RLS_PORT=tcp://10.0.0.1:8081"}
	_, stderr, code := runBinary(t, env, "serve", "--config", missing, "--http-addr", "", "--grpc-addr", "127.0.0.1:0")
	const want = "envoy-rls serve: warning: ENVOY_RLS_BAKEND is set but names no flag of serve; it is ignored (did you mean ENVOY_RLS_BACKEND?)\n"
	if !strings.HasPrefix(stderr, want) || strings.Contains(stderr, "SERVICE_HOST") || strings.Contains(stderr, "ENVOY_RLS_PORT") {
		t.Errorf("stderr does not start with the warning alone:\n got  %q\n want %q", stderr, want)
	}
	if code != 1 {
		t.Errorf("exit %d with a missing config, want 1", code)
	}
}
