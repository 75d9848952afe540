package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestReloadNeverAppliesAPausedWrite: a writer that rewrites the config in
// place and pauses mid-file for 300 ms (longer than the 200 ms quiet time
// the old debounce waited, which then loaded it) leaves a valid but
// shorter file for a moment: requests_per_unit 1000 cut to 1. That partial
// file is not applied: the reload waits until the files read the same
// across the settle time.
func TestReloadNeverAppliesAPausedWrite(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "limits.yaml")
	full := "domain: r\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: hour\n      requests_per_unit: 1000\n"
	cut := strings.Index(full, "1000") + 1
	writeFile(t, cfg, full)
	p := startServe(t, nil, "--config", dir)
	body := `{"domain":"r","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}`
	f, err := os.OpenFile(cfg, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(full[:cut])          // "...requests_per_unit: 1": valid on its own
	time.Sleep(300 * time.Millisecond) // the writer pauses (what is tested, not a wait)
	f.WriteString(full[cut:])
	f.Close()
	// Wait for the last change to be reloaded (or not) for sure: twice
	// the longest reload delay, polled through the log.
	waitFor(t, 10*time.Second, "the reload after the writes", func() bool {
		return strings.Contains(p.Logs(), "config reloaded")
	})
	for i := 0; i < 3; i++ {
		if code, out := p.postJSON(t, body); code != 200 {
			t.Fatalf("call %d: %d %s: a partial config (limit 1) was applied", i, code, out)
		}
	}
	if strings.Contains(p.Logs(), "config reload failed") {
		t.Errorf("a partial config was loaded (and refused):\n%s", p.Logs())
	}
}

// TestReloadUnderARewriteStorm: a config rewritten 100 times a second (a
// config-management loop) is still reloaded while the storm goes on,
// within the maximum delay, instead of the debounce resetting forever.
func TestReloadUnderARewriteStorm(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "limits.yaml")
	writeFile(t, cfg, "domain: r\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n")
	p := startServe(t, nil, "--config", dir)
	next := "domain: r\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n  - key: n\n    rate_limit: {unit: hour, requests_per_unit: 2}\n"
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				os.WriteFile(cfg, []byte(next), 0o644)
			}
		}
	}()
	defer func() { close(stop); <-done }()
	start := time.Now()
	waitFor(t, 20*time.Second, "the new config during the storm", func() bool {
		code, out := p.postJSON(t, `{"domain":"r","descriptors":[{"entries":[{"key":"n","value":"v"}],"hits_addend":0}]}`)
		return code == 200 && strings.Contains(out, "currentLimit")
	})
	t.Logf("reloaded %v into a storm of 100 rewrites/s", time.Since(start))
}
