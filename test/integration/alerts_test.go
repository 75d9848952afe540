package integration

import (
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"gopkg.in/yaml.v3"

	"github.com/envoyrls/envoy-rls/internal/redistest"
	"github.com/envoyrls/envoy-rls/internal/testutil"
)

// TestDocumentedAlertsFireInEveryFailureMode runs one instance per
// failure mode on its own redis-server under a little load, and evaluates
// the alert rules of docs/observability.md on /metrics: over two scrapes
// while Redis is healthy none fires; over a scrape just before Redis is
// killed and one after calls were answered without it,
// EnvoyRLSBackendFailing fires (and EnvoyRLSConfigBroken, about the
// config, does not). Then Redis comes back with no traffic, and the log
// says "recovered" (the readiness probe notices), once.
func TestDocumentedAlertsFireInEveryFailureMode(t *testing.T) {
	rules := documentedAlerts(t)
	if _, ok := rules["EnvoyRLSBackendFailing"]; !ok {
		t.Fatalf("docs/observability.md has no EnvoyRLSBackendFailing alert; found %v", rules)
	}
	cfg := writeConfig(t, fmYAML)
	for _, mode := range []string{"local", "allow", "deny"} {
		t.Run(mode, func(t *testing.T) {
			srv := redistest.StartStandalone(t)
			p := startServe(t, nil, "--config", cfg, "--backend", "redis", "--redis-url", srv.URL(),
				"--failure-mode", mode, "--backend-failure-log-interval", "200ms")
			// 5 s deadlines: no healthy call times out on a loaded machine
			// (two in a window of 100 would be over the alert's 1%).
			ld := startLoad(4, 5*time.Second, func(int) rlsv3.RateLimitServiceClient { return p.client() },
				func(c, i int) *rlsv3.RateLimitRequest {
					return &rlsv3.RateLimitRequest{Domain: "fm", Descriptors: []*commonv3.RateLimitDescriptor{descriptor("k", fmt.Sprintf("a-%d-%d", c, i%50))}}
				})
			var stopOnce sync.Once
			stop := func() { stopOnce.Do(ld.stop) }
			defer stop()
			answered := func(n int) promScrape {
				t.Helper()
				from := time.Now()
				testutil.WaitEvery(t, procPoll, 60*time.Second, fmt.Sprintf("%d calls answered", n), func() bool {
					return ld.count(from, func(sample) bool { return true }) >= n
				})
				return scrapeAt(t, p)
			}
			h0 := scrapeAt(t, p)
			h1 := answered(100)
			for name, expr := range rules {
				if firing := evalAlert(t, expr, h0, h1); len(firing) > 0 {
					t.Errorf("Redis healthy: %s fires: %v (%s)", name, firing, expr)
				}
			}
			srv.Stop()
			o1 := answered(100)
			for name, expr := range rules {
				firing := evalAlert(t, expr, h1, o1)
				if want := name == "EnvoyRLSBackendFailing"; (len(firing) > 0) != want {
					t.Errorf("Redis killed: %s firing %v, want firing %v (%s)", name, firing, want, expr)
				}
			}
			// Back, with no traffic: the readiness probe notices.
			stop()
			srv.Restart()
			testutil.WaitFor(t, 30*time.Second, `"rate limit backend recovered" logged`, func() bool {
				return strings.Contains(p.Logs(), "rate limit backend recovered")
			})
			if n := strings.Count(p.Logs(), "rate limit backend recovered"); n != 1 {
				t.Errorf(`"rate limit backend recovered" logged %d times, want 1`, n)
			}
		})
	}
}

// A Redis that never answered never "recovers": not while the local
// fallback answers calls, not at shutdown.
func TestNoRecoveredWhileRedisNeverAnswered(t *testing.T) {
	srv := redistest.StartStandalone(t)
	srv.Stop()
	p := startServeUnready(t, nil, "--config", writeConfig(t, fmYAML), "--backend", "redis", "--redis-url", srv.URL(),
		"--backend-failure-log-interval", "100ms")
	// Single calls, each once the last one was logged: each is a failure
	// (logged at once, or in the summary of its interval) followed by
	// quiet intervals, which are no recovery.
	logged := func() int {
		l := p.Logs()
		return strings.Count(l, "rate limit backend failed") + strings.Count(l, "rate limit backend still failing")
	}
	for i := 0; i < 4; i++ {
		r, err := p.client().ShouldRateLimit(ctxT(t), &rlsv3.RateLimitRequest{Domain: "fm", Descriptors: []*commonv3.RateLimitDescriptor{descriptor("k", "v")}})
		if err != nil || r.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("call %d decided by the local fallback: %v %v", i, r, err)
		}
		testutil.WaitFor(t, 10*time.Second, fmt.Sprintf("call %d logged", i), func() bool { return logged() > i })
	}
	if code := p.stop(t); code != 0 {
		t.Errorf("exit code %d", code)
	}
	if logs := p.Logs(); strings.Contains(logs, "recovered") || !strings.Contains(logs, "rate limit backend failed") {
		t.Errorf("want a failure and no recovery logged:\n%s", logs)
	}
}

// writeConfig writes yaml as a config file and returns its path.
func writeConfig(t *testing.T, yaml string) string {
	t.Helper()
	path := t.TempDir() + "/config.yaml"
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// documentedAlerts returns the alert rules of docs/observability.md (the
// YAML block of Prometheus rule groups), expression by name.
func documentedAlerts(t *testing.T) map[string]string {
	t.Helper()
	doc, err := os.ReadFile(repoFile("docs", "observability.md"))
	if err != nil {
		t.Fatal(err)
	}
	rules := map[string]string{}
	for _, block := range strings.Split(string(doc), "```yaml\n")[1:] {
		block, _, _ = strings.Cut(block, "```")
		var groups struct {
			Groups []struct {
				Rules []struct{ Alert, Expr string }
			}
		}
		if err := yaml.Unmarshal([]byte(block), &groups); err != nil {
			continue
		}
		for _, g := range groups.Groups {
			for _, r := range g.Rules {
				if r.Alert != "" {
					rules[r.Alert] = r.Expr
				}
			}
		}
	}
	return rules
}

// promScrape is one scrape of /metrics and when it was taken.
type promScrape struct {
	at time.Time
	m  testutil.Metrics
}

func scrapeAt(t *testing.T, p *proc) promScrape {
	t.Helper()
	at := time.Now()
	return promScrape{at: at, m: testutil.Scrape(t, p.httpURL+"/metrics")}
}

// evalAlert evaluates a PromQL alert expression over the window between
// scrapes a and b of one instance and returns its firing series (their
// grouping labels), empty when it does not fire. It knows the forms the
// documented alerts use, as Prometheus evaluates them: rate() and
// increase() of counters (a series must be in both scrapes, as one
// sample gives no rate), sum/min/max by (labels), a vector divided by
// another (matched on their labels; a zero divisor gives no sample, as
// NaN or Inf compare as such), and a comparison with a number. "for:" is
// not modelled: the test holds the condition over one window. instance is
// the one process, so it groups nothing.
func evalAlert(t *testing.T, expr string, a, b promScrape) []string {
	t.Helper()
	e := &promEval{t: t, src: strings.Join(strings.Fields(expr), " "), a: a, b: b}
	v := e.comparison()
	if e.pos != len(e.src) {
		t.Fatalf("alert expression %q: cannot evaluate from %q (extend evalAlert)", expr, e.src[e.pos:])
	}
	var firing []string
	for k := range v {
		firing = append(firing, "{"+k+"}")
	}
	sort.Strings(firing)
	return firing
}

// promVector is an instant vector: value by its labels ("k=v,..." sorted).
type promVector map[string]float64

type promEval struct {
	t    *testing.T
	src  string
	pos  int
	a, b promScrape
}

func (e *promEval) space() {
	for e.pos < len(e.src) && e.src[e.pos] == ' ' {
		e.pos++
	}
}

func (e *promEval) accept(tok string) bool {
	e.space()
	if strings.HasPrefix(e.src[e.pos:], tok) {
		e.pos += len(tok)
		return true
	}
	return false
}

func (e *promEval) expect(tok string) {
	if !e.accept(tok) {
		e.t.Fatalf("alert expression %q: want %q at %q", e.src, tok, e.src[e.pos:])
	}
}

func (e *promEval) ident() string {
	e.space()
	start := e.pos
	for e.pos < len(e.src) {
		c := e.src[e.pos]
		if c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' && e.pos > start {
			e.pos++
			continue
		}
		break
	}
	return e.src[start:e.pos]
}

func (e *promEval) comparison() promVector {
	v := e.ratio()
	for _, op := range []string{"==", "!=", ">=", "<=", ">", "<"} {
		if !e.accept(op) {
			continue
		}
		e.space()
		start := e.pos
		for e.pos < len(e.src) && strings.IndexByte("0123456789.e+-", e.src[e.pos]) >= 0 {
			e.pos++
		}
		n, err := strconv.ParseFloat(e.src[start:e.pos], 64)
		if err != nil {
			e.t.Fatalf("alert expression %q: want a number after %s", e.src, op)
		}
		out := promVector{}
		for k, x := range v {
			if compare(op, x, n) {
				out[k] = x
			}
		}
		return out
	}
	return v
}

func compare(op string, x, n float64) bool {
	switch op {
	case "==":
		return x == n
	case "!=":
		return x != n
	case ">=":
		return x >= n
	case "<=":
		return x <= n
	case ">":
		return x > n
	}
	return x < n
}

func (e *promEval) ratio() promVector {
	v := e.term()
	for e.accept("/") {
		d := e.term()
		out := promVector{}
		for k, x := range v {
			if y, ok := d[k]; ok && y != 0 {
				out[k] = x / y
			}
		}
		v = out
	}
	return v
}

func (e *promEval) term() promVector {
	if e.accept("(") {
		v := e.comparison()
		e.expect(")")
		return v
	}
	name := e.ident()
	switch name {
	case "sum", "min", "max":
		e.expect("by")
		e.expect("(")
		var by []string
		for !e.accept(")") {
			by = append(by, e.ident())
			e.accept(",")
		}
		e.expect("(")
		inner := e.comparison()
		e.expect(")")
		return aggregate(name, by, inner)
	case "rate", "increase":
		e.expect("(")
		metric := e.ident()
		e.expect("[")
		for e.pos < len(e.src) && e.src[e.pos] != ']' {
			e.pos++
		}
		e.expect("]")
		e.expect(")")
		return e.rate(metric, name == "increase")
	case "":
		e.t.Fatalf("alert expression %q: cannot evaluate from %q (extend evalAlert)", e.src, e.src[e.pos:])
	}
	return e.series(e.b.m, name)
}

// series returns the samples of metric name in scrape m.
func (e *promEval) series(m testutil.Metrics, name string) promVector {
	v := promVector{}
	f := m[name]
	if f == nil {
		return v
	}
	for _, s := range f.GetMetric() {
		var labels []string
		for _, l := range s.GetLabel() {
			labels = append(labels, l.GetName()+"="+l.GetValue())
		}
		sort.Strings(labels)
		x := s.GetGauge().GetValue()
		if s.Counter != nil {
			x = s.GetCounter().GetValue()
		}
		v[strings.Join(labels, ",")] = x
	}
	return v
}

// rate is the per-second rate (or the increase) of counter name between
// the scrapes, for the series in both.
func (e *promEval) rate(name string, increase bool) promVector {
	a, b := e.series(e.a.m, name), e.series(e.b.m, name)
	secs := e.b.at.Sub(e.a.at).Seconds()
	out := promVector{}
	for k, y := range b {
		if x, ok := a[k]; ok {
			out[k] = y - x
			if !increase {
				out[k] /= secs
			}
		}
	}
	return out
}

func aggregate(op string, by []string, v promVector) promVector {
	out := promVector{}
	for k, x := range v {
		var group []string
		for _, l := range strings.Split(k, ",") {
			for _, g := range by {
				if strings.HasPrefix(l, g+"=") {
					group = append(group, l)
				}
			}
		}
		g := strings.Join(group, ",")
		y, seen := out[g]
		switch {
		case !seen:
			out[g] = x
		case op == "sum":
			out[g] = y + x
		case op == "min":
			out[g] = min(y, x)
		default:
			out[g] = max(y, x)
		}
	}
	return out
}
