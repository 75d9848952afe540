package integration

import (
	"io"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/envoyrls/envoy-rls/internal/cardinality"
	"github.com/envoyrls/envoy-rls/pkg/rls"
)

// maxSeriesLine is the most bytes one series line of a request-derived
// metric takes in a scrape with labels of cardinality.MaxValueBytes: the
// name (at most 40), the domain and rule labels, the value.
const maxSeriesLine = 320

// maxSeriesBytes is the README's figure for the heap one capped series holds:
// client_golang's counter, label pairs and map entry, the label itself and
// its entry in the cap. 12,000 values of 4,000 bytes measured 176 MB of
// peak RSS, 83 MB above the same flood on a rule without detailed_metric.
const maxSeriesBytes = 1024

// TestDetailedMetricLongValues is the attack of F3: 12,000 distinct
// 4,000-byte values on a detailed_metric rule (zero-padded numbers, so they
// share all but their last digits). Each label is at most
// cardinality.MaxValueBytes, the scrape at most the README's bound (six
// capped metrics × (rls.MaxRuleSeries + 1) series × maxSeriesLine), and the
// peak RSS within the README's figure: the RSS at start + 3 × --max-memory
// for the store, plus twice (Go's collector lets the heap grow to twice what
// is live) maxSeriesBytes for each capped series.
func TestDetailedMetricLongValues(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc/<pid>/status")
	}
	const values, valueLen, maxMemory = 12_000, 4000, 32 << 20
	p := startBinary(t, plainBinary(t), 200, nil, "--config", boundsConfig(t), "--max-memory", "32MiB")
	start := procStatusKB(t, p, "VmRSS")
	if ok, want := flood(t, p, "client", 0, values, valueLen, 8), values/8; ok != want {
		t.Fatalf("%d flood requests allowed, want all %d", ok, want)
	}
	var body []byte
	var took time.Duration
	for range 3 { // scrapes build the text in memory: they count in the peak
		begin := time.Now()
		resp, err := httpClient.Get(p.httpURL + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		took = time.Since(begin)
	}
	peak := procStatusKB(t, p, "VmHWM")
	longest, series, client := 0, 0, 0
	for _, line := range strings.Split(string(body), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		series++
		if !strings.Contains(line, "client_0") {
			continue
		}
		client++
		for _, part := range strings.Split(line, `"`) {
			if strings.HasPrefix(part, "client_0") || strings.Contains(part, ".client_0") {
				longest = max(longest, len(part))
			}
		}
		if len(line) > maxSeriesLine {
			t.Errorf("a series line of %d bytes, want at most %d: %.200s", len(line), maxSeriesLine, line)
			break
		}
	}
	t.Logf("%d values of %d bytes: scrape %d bytes in %v, %d series (%d of the values), longest label %d bytes; RSS %d KiB at start, peak %d KiB",
		values, valueLen, len(body), took, series, client, longest, start, peak)
	if client < rls.MaxRuleSeries {
		t.Errorf("%d series of the flooded values, want at least the cap %d", client, rls.MaxRuleSeries)
	}
	if longest == 0 || longest > cardinality.MaxValueBytes {
		t.Errorf("longest request-derived label %d bytes, want 1..%d", longest, cardinality.MaxValueBytes)
	}
	if bound := 6 * (rls.MaxRuleSeries + 1) * maxSeriesLine; len(body) > bound {
		t.Errorf("scrape of %d bytes, above the README's bound %d", len(body), bound)
	}
	if bound := start + 3*maxMemory/1024 + 2*6*(rls.MaxRuleSeries+1)*maxSeriesBytes/1024; peak > bound {
		t.Errorf("peak RSS %d KiB, above the documented bound %d KiB (RSS at start %d KiB + 3 x --max-memory + 2 x 6 x %d series x %d bytes)",
			peak, bound, start, rls.MaxRuleSeries+1, maxSeriesBytes)
	}
}
