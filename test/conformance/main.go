// Command conformance replays request sequences taken from the reference
// server's own test suite (envoyproxy/ratelimit: its integration tests,
// service tests, config tests and the Envoy example scripts of its
// integration-test directory) against the reference server and against
// envoy-rls (embedded store and Redis store), on the same configs, and
// prints every difference, classified as intended (documented in README's
// table of differences, with its reason) or not.
//
// It is not part of CI: it needs a reference binary built from the public
// repository. Run it with
//
//	make conformance REF_BIN=/path/to/ratelimit
//
// It starts its own redis-server processes (one per server under test) on
// free loopback ports, and its own servers; nothing is shared with other
// runs. The reference keeps fixed windows aligned to the wall clock, so a
// scenario starts only when enough of the current minute is left to finish
// it in the same window; a run takes a few minutes.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

func main() {
	refBin := flag.String("ref-bin", os.Getenv("REF_BIN"), "the reference server binary (envoyproxy/ratelimit's cmd, built from its repository)")
	rlsBin := flag.String("rls-bin", "", "the envoy-rls binary (default: built from this repository into a temporary directory)")
	only := flag.String("run", "", "run only scenarios whose name matches this regular expression")
	verbose := flag.Bool("v", false, "print identical steps too")
	flag.Parse()
	if *refBin == "" {
		fmt.Fprintln(os.Stderr, "conformance: -ref-bin (or REF_BIN) is required")
		os.Exit(2)
	}
	if err := run(*refBin, *rlsBin, *only, *verbose, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "conformance:", err)
		os.Exit(1)
	}
}

// target is one server under test.
type target struct {
	name  string
	start func(sc *scenario, dir string) (*server, error)
}

func run(refBin, rlsBin, only string, verbose bool, out io.Writer) error {
	tmp, err := os.MkdirTemp("", "conformance-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if rlsBin == "" {
		rlsBin = filepath.Join(tmp, "envoy-rls")
		build := exec.Command("go", "build", "-o", rlsBin, "./cmd/envoy-rls")
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			return fmt.Errorf("building envoy-rls: %v", err)
		}
	}
	var filter *regexp.Regexp
	if only != "" {
		if filter, err = regexp.Compile(only); err != nil {
			return err
		}
	}
	targets := []target{
		{"reference", func(sc *scenario, dir string) (*server, error) { return startReference(refBin, sc, dir) }},
		{"envoy-rls/memory", func(sc *scenario, dir string) (*server, error) { return startRLS(rlsBin, "memory", sc, dir) }},
		{"envoy-rls/redis", func(sc *scenario, dir string) (*server, error) { return startRLS(rlsBin, "redis", sc, dir) }},
	}
	var total tally
	for i := range scenarios {
		sc := &scenarios[i]
		if filter != nil && !filter.MatchString(sc.name) {
			continue
		}
		results := make([][]result, len(targets))
		for ti, tg := range targets {
			dir := filepath.Join(tmp, fmt.Sprintf("s%d-t%d", i, ti))
			res, err := replay(tg, sc, dir)
			if err != nil {
				return fmt.Errorf("%s on %s: %v", sc.name, tg.name, err)
			}
			results[ti] = res
		}
		for ti := 1; ti < len(targets); ti++ {
			t := compare(out, sc, targets[ti].name, results[0], results[ti], verbose)
			total.add(t)
		}
	}
	fmt.Fprintf(out, "\nsteps compared: %d (each envoy-rls store against the reference)\n", total.identical+total.intended+total.unintended)
	fmt.Fprintf(out, "identical: %d\nintended differences: %d\nunintended differences: %d\n", total.identical, total.intended, total.unintended)
	if total.unintended > 0 {
		return fmt.Errorf("%d unintended differences", total.unintended)
	}
	return nil
}

type tally struct{ identical, intended, unintended int }

func (t *tally) add(o tally) {
	t.identical += o.identical
	t.intended += o.intended
	t.unintended += o.unintended
}

// result is one step's normalized answer: field name -> value.
type result struct {
	skipped bool
	fields  map[string]string
}

func replay(tg target, sc *scenario, dir string) ([]result, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	srv, err := tg.start(sc, dir)
	if err != nil {
		return nil, err
	}
	defer srv.stop()
	waitForWindow(sc)
	var out []result
	var last *rlsv3.RateLimitResponse
	for _, st := range sc.steps {
		if st.reload != "" {
			if err := srv.reload(st.reload); err != nil {
				return nil, err
			}
			out = append(out, result{skipped: true})
			continue
		}
		req := st.request(last)
		if req == nil {
			out = append(out, result{skipped: true})
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		sent := time.Now()
		resp, err := rlsv3.NewRateLimitServiceClient(srv.conn).ShouldRateLimit(ctx, req)
		cancel()
		out = append(out, result{fields: normalize(resp, err, sent)})
		if err == nil {
			last = resp
		}
	}
	return out, nil
}

// waitForWindow waits until the scenario can run within one minute (and,
// for per-second limits, at the start of a second), as the reference's
// windows are aligned to the wall clock.
func waitForWindow(sc *scenario) {
	now := time.Now()
	if into := now.Sub(now.Truncate(time.Minute)); into > 40*time.Second {
		time.Sleep(time.Minute - into + 200*time.Millisecond)
		now = time.Now()
	}
	if sc.perSecond {
		time.Sleep(now.Truncate(time.Second).Add(time.Second + 20*time.Millisecond).Sub(now))
	}
}

// phase turns a duration until reset, reported for a request sent at sent,
// into the second of the minute at which it ends: the servers under test run
// one after the other, so the same window end is compared, not the same
// count down ("~S", S in 0..59; equal allows one second either way).
func phase(sent time.Time, d time.Duration) string {
	end := sent.Add(d).Round(time.Second)
	return "~" + strconv.FormatInt(end.Unix()%60, 10)
}

func normalize(resp *rlsv3.RateLimitResponse, err error, sent time.Time) map[string]string {
	f := map[string]string{}
	if err != nil {
		f["error"] = status.Code(err).String()
		return f
	}
	f["overall"] = resp.OverallCode.String()
	f["statuses"] = strconv.Itoa(len(resp.Statuses))
	for i, st := range resp.Statuses {
		p := fmt.Sprintf("status[%d].", i)
		f[p+"code"] = st.Code.String()
		if cl := st.CurrentLimit; cl != nil {
			f[p+"limit"] = fmt.Sprintf("%d/%s name=%q x%d", cl.RequestsPerUnit, cl.Unit, cl.Name, cl.GetUnitMultiplier().GetValue())
		} else {
			f[p+"limit"] = "none"
		}
		f[p+"remaining"] = strconv.FormatUint(uint64(st.LimitRemaining), 10)
		if d := st.DurationUntilReset; d != nil {
			f[p+"reset"] = phase(sent, d.AsDuration())
		} else {
			f[p+"reset"] = "none"
		}
	}
	var hs []string
	for _, h := range resp.ResponseHeadersToAdd {
		v := h.Value
		if strings.EqualFold(h.Key, "Retry-After") {
			f["ext.retry-after"] = "present" // an extension: see extensions
			continue
		}
		if strings.EqualFold(h.Key, "RateLimit-Reset") {
			if n, err := strconv.ParseInt(v, 10, 64); err == nil {
				v = phase(sent, time.Duration(n)*time.Second)
			}
		}
		hs = append(hs, h.Key+"="+v)
	}
	sort.Strings(hs)
	f["headers"] = strings.Join(hs, ",")
	if md := resp.DynamicMetadata; md != nil && md.Fields["envoy_rls"] != nil {
		f["ext.envoy_rls"] = "present" // an extension: see extensions
		md = proto.Clone(md).(*structpb.Struct)
		delete(md.Fields, "envoy_rls")
		if len(md.Fields) == 0 {
			md = nil
		}
		resp = &rlsv3.RateLimitResponse{DynamicMetadata: md}
	}
	if resp.DynamicMetadata != nil {
		b, _ := protojson.MarshalOptions{}.Marshal(resp.DynamicMetadata)
		// protojson and prototext vary their spacing on purpose.
		f["metadata"] = strings.Join(strings.Fields(string(b)), "")
	} else {
		f["metadata"] = "none"
	}
	return f
}

// extensions is the reason of differences that are only additions the
// reference does not make: Retry-After on OVER_LIMIT answers and the
// denying rule under dynamic_metadata.envoy_rls (README: "Telling the
// client and the operator what happened").
const extensions = "extension: Retry-After and dynamic_metadata.envoy_rls on OVER_LIMIT answers"

// equal compares two field values; "~S" values (the second of the minute
// a window ends, see phase) may differ by one, around the minute too.
func equal(a, b string) bool {
	if a == b {
		return true
	}
	if strings.HasPrefix(a, "~") && strings.HasPrefix(b, "~") {
		x, err1 := strconv.ParseInt(a[1:], 10, 64)
		y, err2 := strconv.ParseInt(b[1:], 10, 64)
		d := ((x-y)%60 + 60) % 60
		return err1 == nil && err2 == nil && (d <= 1 || d == 59)
	}
	return false
}

func compare(out io.Writer, sc *scenario, name string, ref, got []result, verbose bool) tally {
	var t tally
	for i := range sc.steps {
		if ref[i].skipped || got[i].skipped {
			continue
		}
		var diffs []string
		keys := map[string]bool{}
		for k := range ref[i].fields {
			keys[k] = true
		}
		for k := range got[i].fields {
			keys[k] = true
		}
		var sorted []string
		for k := range keys {
			sorted = append(sorted, k)
		}
		sort.Strings(sorted)
		if r, g := ref[i].fields["error"], got[i].fields["error"]; r != g {
			sorted = []string{"error"} // the rest follows from it
		}
		for _, k := range sorted {
			r, ok1 := ref[i].fields[k]
			g, ok2 := got[i].fields[k]
			if !ok1 || !ok2 || !equal(r, g) {
				diffs = append(diffs, fmt.Sprintf("%s: reference %q, envoy-rls %q", k, r, g))
			}
		}
		st := sc.steps[i]
		label := fmt.Sprintf("%s step %d (%s) on %s", sc.name, i, st.describe(), name)
		onlyExt := len(diffs) > 0
		for _, d := range diffs {
			onlyExt = onlyExt && strings.HasPrefix(d, "ext.")
		}
		if onlyExt && st.intended == "" {
			st.intended = extensions
		}
		switch {
		case len(diffs) == 0:
			t.identical++
			if verbose {
				fmt.Fprintf(out, "identical   %s\n", label)
			}
		case st.intended != "":
			t.intended++
			fmt.Fprintf(out, "INTENDED    %s: %s\n              %s\n", label, st.intended, strings.Join(diffs, "\n              "))
		default:
			t.unintended++
			fmt.Fprintf(out, "UNINTENDED  %s\n              %s\n", label, strings.Join(diffs, "\n              "))
		}
	}
	return t
}

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

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func startRedis(dir string) (*exec.Cmd, int, error) {
	port, err := freePort()
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
		if ports[i], err = freePort(); err != nil {
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
	gport, err := freePort()
	if err != nil {
		return nil, err
	}
	hport, err := freePort()
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

// Requests.

type entry struct{ k, v string }

// desc is one request descriptor.
type desc struct {
	entries  []entry
	hits     *uint64 // the descriptor's own hits_addend
	override *commonv3.RateLimitDescriptor_RateLimitOverride
	// fromMeta takes the value of the descriptor's only entry from the
	// previous response's dynamic metadata (metadata.service_with_quota.name),
	// as Envoy's routing on that metadata does in the multi-service example.
	fromMeta bool
}

type step struct {
	domain   string
	descs    []desc
	hits     uint32 // the request's hits_addend
	reload   string // instead of a request: the new config
	intended string // why a difference here is intended (README's table)
	// ifAllowed sends the request only when the previous one was allowed
	// (a charge Envoy sends when a stream it let through is done).
	ifAllowed bool
}

func (s step) describe() string {
	var parts []string
	for _, d := range s.descs {
		var es []string
		for _, e := range d.entries {
			es = append(es, e.k+"="+e.v)
		}
		p := strings.Join(es, ",")
		if d.fromMeta {
			p += "<-metadata"
		}
		if d.hits != nil {
			p += fmt.Sprintf(" hits=%d", *d.hits)
		}
		if d.override != nil {
			p += fmt.Sprintf(" override=%d/%s", d.override.RequestsPerUnit, d.override.Unit)
		}
		parts = append(parts, "["+p+"]")
	}
	h := ""
	if s.hits > 0 {
		h = fmt.Sprintf(" hits_addend=%d", s.hits)
	}
	return s.domain + " " + strings.Join(parts, "") + h
}

func (s step) request(last *rlsv3.RateLimitResponse) *rlsv3.RateLimitRequest {
	if s.ifAllowed && (last == nil || last.OverallCode != rlsv3.RateLimitResponse_OK) {
		return nil
	}
	req := &rlsv3.RateLimitRequest{Domain: s.domain, HitsAddend: s.hits}
	for _, d := range s.descs {
		rd := &commonv3.RateLimitDescriptor{Limit: d.override}
		for _, e := range d.entries {
			v := e.v
			if d.fromMeta {
				v = last.GetDynamicMetadata().GetFields()["metadata"].GetStructValue().GetFields()["service_with_quota"].GetStructValue().GetFields()["name"].GetStringValue()
				if v == "" {
					return nil
				}
			}
			rd.Entries = append(rd.Entries, &commonv3.RateLimitDescriptor_Entry{Key: e.k, Value: v})
		}
		if d.hits != nil {
			rd.HitsAddend = wrap(*d.hits)
		}
		req.Descriptors = append(req.Descriptors, rd)
	}
	return req
}
