package integration

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/envoyrls/envoy-rls/internal/testutil"
	"github.com/envoyrls/envoy-rls/pkg/rls"
)

// boundsYAML is the config of the memory-bound floods: per-hour limits, so
// that no window ends during a test.
const boundsYAML = `domain: bounds
descriptors:
  - key: blob
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: victim
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: flood
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: spent
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: client
    detailed_metric: true
    rate_limit: {unit: hour, requests_per_unit: 1000}
`

func boundsConfig(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "bounds.yaml")
	if err := os.WriteFile(path, []byte(boundsYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

var (
	plainOnce sync.Once
	plainBin  string
	plainErr  error
)

// plainBinary builds envoy-rls without the race detector, once per run: its
// shadow memory would swamp the memory figures these tests check, and it
// slows floods of hundreds of thousands of values tenfold.
func plainBinary(t *testing.T) string {
	t.Helper()
	plainOnce.Do(func() {
		plainBin = filepath.Join(filepath.Dir(binary), "envoy-rls-plain")
		out, err := exec.Command("go", "build", "-o", plainBin, "../../cmd/envoy-rls").CombinedOutput()
		if err != nil {
			plainErr = fmt.Errorf("building envoy-rls without -race: %v\n%s", err, out)
		}
	})
	if plainErr != nil {
		t.Fatal(plainErr)
	}
	return plainBin
}

// procStatusKB reads a field of /proc/<pid>/status in KiB (VmRSS: resident
// now, VmHWM: the peak resident set).
func procStatusKB(t *testing.T, p *proc, field string) uint64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("%s: %q", field, line)
			}
			return n
		}
	}
	t.Fatalf("no %s in /proc/<pid>/status", field)
	return 0
}

// waitRSSSettled waits until p has taken what it will take: its RSS
// unchanged for 1 s (50 polls 20 ms apart).
func waitRSSSettled(t *testing.T, p *proc) {
	t.Helper()
	last, still := procStatusKB(t, p, "VmRSS"), 0
	testutil.WaitEvery(t, procPoll, 30*time.Second, "RSS to settle", func() bool {
		now := procStatusKB(t, p, "VmRSS")
		if now == last {
			still++
		} else {
			last, still = now, 0
		}
		return still >= 50
	})
}

// flood sends n distinct values of key, valueLen bytes each (the numbers
// from first, zero-padded), perRequest descriptors per request, from four
// clients at once, and returns how many requests were answered OK.
func flood(t *testing.T, p *proc, key string, first, n, valueLen, perRequest int) int {
	t.Helper()
	var next, ok atomic.Int64
	next.Store(int64(first))
	end := int64(first + n)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			c := p.client()
			for {
				from := next.Add(int64(perRequest)) - int64(perRequest)
				if from >= end {
					return
				}
				req := &rlsv3.RateLimitRequest{Domain: "bounds"}
				for i := from; i < min(from+int64(perRequest), end); i++ {
					req.Descriptors = append(req.Descriptors, descriptor(key, fmt.Sprintf("%0*d", valueLen, i)))
				}
				resp, err := c.ShouldRateLimit(context.Background(), req)
				if err != nil {
					t.Errorf("flood: %v", err)
					return
				}
				if resp.OverallCode == rlsv3.RateLimitResponse_OK {
					ok.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return int(ok.Load())
}

// TestMemoryBoundFourKBValues floods distinct 4 KB descriptor values, each a
// new key of about 5 KB in the store (4,864 bytes of key allocation and 240
// of overhead), until six times --max-memory has passed through: the store
// stays within --max-memory by its estimate, and the process's peak RSS
// within the documented figure, the RSS at start plus 3 x --max-memory plus
// the remembered table (--remembered-keys x 32 bytes, 64 MB), which keeps
// the flood's part-used keys.
func TestMemoryBoundFourKBValues(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc/<pid>/status")
	}
	const maxMemory = 32 << 20
	const rememberedBytes = 2_000_000 * 32
	p := startBinary(t, plainBinary(t), 200, nil, "--config", boundsConfig(t), "--max-memory", "32MiB")
	start := procStatusKB(t, p, "VmRSS")
	const values = 6 * maxMemory / 4096 // ~49,000 keys, ~5 KB each
	if ok := flood(t, p, "blob", 0, values, 4096, 8); ok != values/8 {
		t.Fatalf("%d of %d flood requests allowed", ok, values/8)
	}
	peak, now := procStatusKB(t, p, "VmHWM"), procStatusKB(t, p, "VmRSS")
	bytes := metricValue(t, p, "envoy_rls_memory_bytes")
	keys := metricValue(t, p, "envoy_rls_memory_keys")
	var evicted float64
	for _, n := range testutil.Scrape(t, p.httpURL+"/metrics").ByLabelValues("envoy_rls_memory_evictions_total") {
		evicted += n
	}
	remembered := metricValue(t, p, "envoy_rls_memory_remembered_keys")
	t.Logf("%d values of 4 KB: RSS %d KiB at start, %d KiB now, peak %d KiB; store %d keys, %.0f estimated bytes, %.0f evicted, %.0f remembered",
		values, start, now, peak, int(keys), bytes, evicted, remembered)
	if bytes > maxMemory || keys*5000 > maxMemory {
		t.Errorf("store holds %v keys, %v estimated bytes: more than --max-memory %d", keys, bytes, maxMemory)
	}
	if evicted < values-keys-1000 {
		t.Errorf("%v evicted of %d keys, %v held", evicted, values, keys)
	}
	// The flood's keys are part used (one hit of 10): the remembered table
	// keeps them, and takes up to its whole size as they land.
	if remembered < evicted-1000 {
		t.Errorf("%v of %v evicted keys remembered", remembered, evicted)
	}
	if bound := start + 3*maxMemory/1024 + rememberedBytes/1024; peak > bound {
		t.Errorf("peak RSS %d KiB, above the documented bound %d KiB (RSS at start %d KiB + 3 x --max-memory + --remembered-keys x 32)", peak, bound, start)
	}
}

// TestEvictionFloodKeepsExhaustedKeyDenied runs the floods of
// memory.TestFloodDefaults through the gRPC path, on a binary with
// --max-keys 1000 and the remembered table and penalty set scaled with it
// (2,000 and 100 records: the defaults' ratios). It exhausts a key of 5 per
// hour and uses 9 hits of a key of 10 per hour, then floods 1,500 distinct
// keys that each run out (1 per hour, one hit: every eviction is live), and
// then keys part used (one hit of 10) until the store has evicted the
// exhausted key (at least 5 x --max-keys: the cache keeps keys in use). The
// exhausted key is still denied, from the remembered table, until its
// window ends; the part-used key has exactly its last hit left; no evicted
// state of the first flood was lost, and no exhausted record was dropped for
// the second: when the table is full, the part-used flood's own records
// (each a hit of 10 used) make room for each other.
func TestEvictionFloodKeepsExhaustedKeyDenied(t *testing.T) {
	const maxKeys = 1000
	p := startBinary(t, plainBinary(t), 200, nil, "--config", boundsConfig(t), "--max-keys", strconv.Itoa(maxKeys),
		"--remembered-keys", strconv.Itoa(2*maxKeys), "--penalty-keys", strconv.Itoa(maxKeys/10))
	c := p.client()
	call := func(key, value string) *rlsv3.RateLimitResponse {
		t.Helper()
		resp, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{
			Domain: "bounds", Descriptors: []*commonv3.RateLimitDescriptor{descriptor(key, value)}})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	for i := range 5 {
		if r := call("victim", "alice"); r.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("hit %d of 5: %v", i+1, r.OverallCode)
		}
	}
	if r := call("victim", "alice"); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("6th hit of 5 per hour: %v", r.OverallCode)
	}
	for i := range 9 {
		if r := call("flood", "part"); r.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("part-used key, hit %d of 10: %v", i+1, r.OverallCode)
		}
	}
	denied := func(when string) {
		t.Helper()
		r := call("victim", "alice")
		if r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("%s, the exhausted key was answered %v", when, r.OverallCode)
		}
		if reset := r.Statuses[0].GetDurationUntilReset().AsDuration(); reset <= 0 {
			t.Fatalf("%s: duration until reset %v, want the rest of the hour", when, reset)
		}
	}
	// 1,500 keys that each run out: all of their evictions are kept, now
	// and when the next flood evicts the ones the cache still holds (1,502
	// records with the targets, below 96 % of the table).
	if ok, want := flood(t, p, "spent", 0, 3*maxKeys/2, 16, 64), (3*maxKeys/2+63)/64; ok != want {
		t.Fatalf("%d of %d flood requests (of 64 fresh keys of 1 per hour) answered OK", ok, want)
	}
	denied("after 1,500 exhausted keys")
	if l, d := metricValue(t, p, "envoy_rls_memory_evictions_total", "kind=lost"), metricValue(t, p, "envoy_rls_memory_remembered_dropped_total", "kind=exhausted"); l != 0 || d != 0 {
		t.Fatalf("after 1,500 exhausted keys: %v evictions lost, %v exhausted records dropped", l, d)
	}

	// Part-used keys in rounds of --max-keys until the exhausted key is
	// evicted (and restored when asked): at least 5 x --max-keys, at most
	// 100 x. Look seldom: each look makes the cache likelier to keep it.
	flooded := 0
	for {
		flood(t, p, "flood", flooded, maxKeys, 16, 64)
		flooded += maxKeys
		if flooded < 5*maxKeys || flooded%(5*maxKeys) != 0 {
			continue
		}
		denied(fmt.Sprintf("after %d part-used keys", flooded))
		if metricValue(t, p, "envoy_rls_memory_remembered_restored_total") >= 1 {
			break
		}
		if flooded >= 100*maxKeys {
			t.Fatalf("%d part-used keys did not evict the exhausted key", flooded)
		}
	}
	if r := call("flood", "part"); r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("part-used key's 10th hit of 10: %v", r.OverallCode)
	}
	if r := call("flood", "part"); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("part-used key's 11th hit of 10: %v", r.OverallCode)
	}
	// Lost: only part-used records of the flood, each dropped for another.
	m := testutil.Scrape(t, p.httpURL+"/metrics")
	l, part := m.Value("envoy_rls_memory_evictions_total", "kind=lost"), m.Count("envoy_rls_memory_remembered_dropped_total", "kind=part_used")
	// An exhausted record is dropped from the table only when both its
	// buckets hold exhausted records (hash luck at this fill): it then
	// moves to the penalty set, which must have kept every one (held, or
	// given back when its key came again).
	d, pd := m.Count("envoy_rls_memory_remembered_dropped_total", "kind=exhausted"), m.Value("envoy_rls_memory_penalty_dropped_total")
	kept := m.Value("envoy_rls_memory_penalty_keys") + m.Value("envoy_rls_memory_penalty_restored_total")
	if l > part || pd != 0 || kept < d {
		t.Fatalf("%v evictions lost, %v part-used and %v exhausted records dropped; penalty set: %v dropped, %v held or restored", l, part, d, pd, kept)
	}
	t.Logf("%d part-used keys; evictions %v; remembered %v, restored %v, part-used records dropped %v", flooded,
		m.ByLabelValues("envoy_rls_memory_evictions_total"), m.Value("envoy_rls_memory_remembered_keys"),
		m.Value("envoy_rls_memory_remembered_restored_total"), m.Value("envoy_rls_memory_remembered_dropped_total", "kind=part_used"))
}

// TestOversizedRequestIsRefused sends a request larger than
// --grpc-max-recv-msg-size (64 KiB by default): it is answered
// RESOURCE_EXHAUSTED, and the service goes on answering.
func TestOversizedRequestIsRefused(t *testing.T) {
	p := startServe(t, nil, "--config", boundsConfig(t))
	c := p.client()
	request := func(values int) *rlsv3.RateLimitRequest {
		req := &rlsv3.RateLimitRequest{Domain: "bounds"}
		for i := range values { // 4,000 bytes each (entries are at most 4,096)
			req.Descriptors = append(req.Descriptors, descriptor("blob", fmt.Sprintf("%04000d", i)))
		}
		return req
	}
	if _, err := c.ShouldRateLimit(context.Background(), request(20)); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("80 KB request: %v, want ResourceExhausted (--grpc-max-recv-msg-size 64KiB)", err)
	}
	resp, err := c.ShouldRateLimit(context.Background(), request(10))
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("40 KB request: %v %v", resp, err)
	}
}

// TestDetailedMetricFlood sends 200,000 distinct values of a descriptor with
// detailed_metric: every rule metric keeps at most rls.MaxRuleSeries series
// of them, the rest count in one overflow series, and the overflow counter
// says how many values it took.
func TestDetailedMetricFlood(t *testing.T) {
	const values = 200_000
	p := startBinary(t, plainBinary(t), 200, nil, "--config", boundsConfig(t))
	start := time.Now()
	if ok, want := flood(t, p, "client", 0, values, 8, rls.MaxDescriptors), (values+rls.MaxDescriptors-1)/rls.MaxDescriptors; ok != want {
		t.Fatalf("%d flood requests allowed, want all %d", ok, want)
	}
	flooded := time.Now()
	resp, err := httpClient.Get(p.httpURL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	t.Logf("flood took %v, scrape %v", flooded.Sub(start), time.Since(flooded))
	series := map[string]int{} // per metric name
	total := 0
	for _, line := range strings.Split(string(body), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		total++
		name, _, _ := strings.Cut(line, "{")
		name, _, _ = strings.Cut(name, " ")
		series[name]++
	}
	t.Logf("%d values: scrape of %d bytes, %d series; envoy_rls_rule_hits_total has %d", values, len(body), total, series["envoy_rls_rule_hits_total"])
	if n := series["envoy_rls_rule_hits_total"]; n < rls.MaxRuleSeries || n > rls.MaxRuleSeries+1 {
		t.Errorf("envoy_rls_rule_hits_total has %d series, want the cap %d + 1 overflow", n, rls.MaxRuleSeries)
	}
	for name, n := range series {
		if n > rls.MaxRuleSeries+1 {
			t.Errorf("%s has %d series, more than the cap %d + 1 overflow", name, n, rls.MaxRuleSeries)
		}
	}
	m := regexp.MustCompile(`(?m)^envoy_rls_metric_label_overflow_total\{metric="envoy_rls_rule"\} (\S+)$`).FindSubmatch(body)
	if m == nil || string(m[1]) != strconv.Itoa(values-rls.MaxRuleSeries) {
		t.Errorf("overflow counter %q, want %d", m, values-rls.MaxRuleSeries)
	}
}
