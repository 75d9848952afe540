package integration

import (
	"fmt"
	"github.com/envoyrls/envoy-rls/internal/testutil"
	"os"
	"path/filepath"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// stormConfig is version v of a config: descriptors a and b of domain d,
// both limited to stormBase+v an hour (high enough that the polls never
// exhaust them). cut is where a writer that pauses mid-file stops first:
// after a, so the part alone is a valid config that leaves b unlimited,
// what a truncated file served.
func stormConfig(v int) (full string, cut int) {
	a := fmt.Sprintf("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: hour, requests_per_unit: %d}\n", stormBase+v)
	b := fmt.Sprintf("  - key: b\n    rate_limit: {unit: hour, requests_per_unit: %d}\n", stormBase+v)
	return a + b, len(a)
}

const stormBase = 1_000_000

// servedVersion asks the service for a and b and returns the version it
// answers with, and whether that config was whole (b limited as a is).
func servedVersion(t *testing.T, p *proc) (int, bool, error) {
	r, err := p.client().ShouldRateLimit(ctxT(t), &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*commonv3.RateLimitDescriptor{descriptor("a", "x"), descriptor("b", "x")}})
	if err != nil {
		return 0, false, err
	}
	if len(r.Statuses) != 2 || r.Statuses[0].CurrentLimit == nil {
		return 0, false, fmt.Errorf("answer %v: a has no limit", r)
	}
	a := int(r.Statuses[0].CurrentLimit.RequestsPerUnit) - stormBase
	return a, r.Statuses[1].CurrentLimit != nil && int(r.Statuses[1].CurrentLimit.RequestsPerUnit)-stormBase == a, nil
}

// servedFinal waits until the service answers with version final, whole.
func servedFinal(t *testing.T, p *proc, final int) {
	t.Helper()
	testutil.WaitEvery(t, procPoll, 20*time.Second, fmt.Sprintf("version %d served", final), func() bool {
		got, whole, err := servedVersion(t, p)
		if err != nil {
			t.Fatal(err)
		}
		return got == final && whole
	})
}

// pollDuring calls servedVersion until stop is closed and returns every
// version answered, in order; an answer from a truncated config fails the
// test. It may run on a goroutine of its own.
func pollDuring(t *testing.T, p *proc, stop <-chan struct{}) []int {
	t.Helper()
	var seen []int
	for n := 0; ; n++ {
		select {
		case <-stop:
			return seen
		default:
		}
		v, whole, err := servedVersion(t, p)
		if err != nil {
			t.Errorf("answer %d: %v", n, err)
			return seen
		}
		if !whole {
			t.Errorf("answer %d (version %d): b had no limit: a truncated config served", n, v)
		}
		if len(seen) == 0 || seen[len(seen)-1] != v {
			seen = append(seen, v)
		}
	}
}

// TestReloadUnderARewriteStorm: a config replaced atomically 100 times a
// second with different content (written next to it, renamed over it) is
// reloaded during the storm, every answer from a whole version and none
// older than the one before, and the last version serves after it. Before,
// no reload happened until the storm ended (the test then rewrote the same
// content, which hid it). The bound on each reload's delay, relative to
// the measured scheduling delay, is TestAtomicReplacementsApplyDuringAStorm
// (cmd/envoy-rls), in the watcher's process.
func TestReloadUnderARewriteStorm(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "limits.yaml")
	full, _ := stormConfig(1)
	writeFile(t, cfg, full)
	p := startServe(t, nil, "--config", dir)
	stop := make(chan struct{})
	seenc := make(chan []int)
	go func() { seenc <- pollDuring(t, p, stop) }()
	const storm = 8 * time.Second // four times the longest reload delay
	start := time.Now()
	v := 1
	for time.Since(start) < storm {
		time.Sleep(10 * time.Millisecond) // the writer's pace (what is tested, not a wait)
		v++
		full, _ := stormConfig(v)
		tmp := filepath.Join(dir, ".limits.yaml.tmp")
		writeFile(t, tmp, full)
		if err := os.Rename(tmp, cfg); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	seen := <-seenc
	for i := 1; i < len(seen); i++ {
		if seen[i] < seen[i-1] {
			t.Errorf("version %d served after %d", seen[i], seen[i-1])
		}
	}
	// At least two reloads while the storm went on (one every 2 s at the
	// latest, so three or four on an idle machine).
	if len(seen) < 3 {
		t.Errorf("versions served during the storm of %d: %v, want at least two reloads", v, seen)
	}
	final := v
	servedFinal(t, p, final)
	t.Logf("%d versions written in %v; served during the storm: %v", v, storm, seen)
}

// TestReloadNeverAppliesAPausedWrite: a config rewritten in place again
// and again with different content, each time by a writer that pauses 450
// to 900 ms mid-file (the part alone valid: b without a limit), never
// serves a truncated file, and serves the last version once the file has
// been left alone for --config-reload-hold (2 s by default). Before, 8.4 %
// of answers during such writes had no limit for b.
func TestReloadNeverAppliesAPausedWrite(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "limits.yaml")
	full, _ := stormConfig(1)
	writeFile(t, cfg, full)
	p := startServe(t, nil, "--config", dir)
	stop := make(chan struct{})
	seenc := make(chan []int)
	go func() { seenc <- pollDuring(t, p, stop) }()
	pauses := []time.Duration{450, 900, 600, 750, 500, 850}
	for i, pause := range pauses {
		full, cut := stormConfig(i + 2)
		f, err := os.OpenFile(cfg, os.O_WRONLY|os.O_TRUNC, 0)
		if err != nil {
			t.Fatal(err)
		}
		f.WriteString(full[:cut])
		time.Sleep(pause * time.Millisecond) // the writer pauses mid-file (what is tested, not a wait)
		f.WriteString(full[cut:])
		f.Close()
	}
	final := len(pauses) + 1
	servedFinal(t, p, final)
	close(stop)
	seen := <-seenc
	t.Logf("served: %v", seen)
}
