package main

import (
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// recorder is a prometheus.Registerer that records the names of the
// metrics registered with it, whether or not they have samples yet.
type recorder struct{ names map[string]bool }

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

func (r *recorder) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc, 16)
	go func() { c.Describe(ch); close(ch) }()
	for d := range ch {
		if m := fqName.FindStringSubmatch(d.String()); m != nil {
			r.names[m[1]] = true
		}
	}
	return nil
}

func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		_ = r.Register(c)
	}
}

func (r *recorder) Unregister(prometheus.Collector) bool { return true }

// exported returns every metric name the binary can export: the service's,
// and those of both stores.
func exported(t *testing.T) map[string]bool {
	t.Helper()
	rec := &recorder{names: map[string]bool{}}
	observabilityOptions{}.registerMetrics(rec)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, o := range []options{
		{Backend: "memory", Memory: memoryOptions{MaxKeys: 10}},
		{Backend: "redis", Redis: redisOptions{Main: redisConn{RedisURL: mustRedisURL("redis://127.0.0.1:1"), RedisBatchSize: 1}}},
		{Backend: "redis", Redis: redisOptions{Main: redisConn{RedisURL: mustRedisURL("redis://127.0.0.1:1"), RedisBatchSize: 1},
			PerSecond: redisConn{prefix: perSecondPrefix, RedisURL: mustRedisURL("redis://127.0.0.1:2"), RedisBatchSize: 1}}},
	} {
		store, err := newStore(o, rec, log, nil)
		if err != nil {
			t.Fatalf("%s store: %v", o.Backend, err)
		}
		store.Close()
	}
	return rec.names
}

var metricName = regexp.MustCompile(`\benvoy_rls_[a-z0-9_]+`)

// Every query of the Grafana dashboard names only metrics the service
// exports (histograms by their _bucket, _sum and _count series).
func TestGrafanaDashboardQueriesExportedMetrics(t *testing.T) {
	names := exported(t)
	for _, want := range []string{"envoy_rls_requests_total", "envoy_rls_rule_hits_total", "envoy_rls_memory_keys", "envoy_rls_redis_local_denials_total", "envoy_rls_build_info"} {
		if !names[want] {
			t.Fatalf("the registry walk misses %s; found %v", want, names)
		}
	}
	raw, err := os.ReadFile("../../deploy/grafana/envoy-rls.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string
			Type    string
			Targets []struct{ Expr string }
		}
		Templating struct {
			List []struct {
				Name  string
				Query any
			}
		}
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}
	var exprs []string
	for _, p := range dash.Panels {
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	for _, v := range dash.Templating.List {
		if q, _ := json.Marshal(v.Query); strings.Contains(string(q), "envoy_rls_") {
			exprs = append(exprs, string(q))
		}
	}
	// docs/observability.md's example queries and alert rules (the code blocks of its
	// Metrics section) too.
	readme, err := os.ReadFile("../../docs/observability.md")
	if err != nil {
		t.Fatal(err)
	}
	section := string(readme)
	if i := strings.Index(section, "\n## Metrics\n"); i >= 0 {
		section = section[i+1:]
		if j := strings.Index(section, "\n## "); j >= 0 {
			section = section[:j]
		}
	} else {
		t.Fatal("docs/observability.md has no Metrics section")
	}
	blocks := strings.Split(section, "```")
	if len(blocks) < 5 {
		t.Fatalf("docs/observability.md's Metrics section has %d code blocks, want the queries and the alerts", len(blocks)/2)
	}
	for i := 1; i < len(blocks); i += 2 {
		for _, line := range strings.Split(blocks[i], "\n") {
			if strings.Contains(line, "envoy_rls_") && !strings.HasPrefix(strings.TrimSpace(line), "#") {
				exprs = append(exprs, line)
			}
		}
	}
	used := map[string]bool{}
	for _, e := range exprs {
		refs := metricName.FindAllString(e, -1)
		if len(refs) == 0 {
			t.Errorf("query %q names no envoy_rls metric", e)
		}
		for _, n := range refs {
			base := n
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				if b, ok := strings.CutSuffix(n, suffix); ok && names[b] {
					base = b
				}
			}
			if !names[base] {
				t.Errorf("query %q names %s, which the service does not export", e, n)
			}
			used[base] = true
		}
	}
	// And the dashboard shows every rule metric.
	var missing []string
	for n := range names {
		if strings.HasPrefix(n, "envoy_rls_rule_") && !used[n] {
			missing = append(missing, n)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("the dashboard shows none of %v", missing)
	}
}
