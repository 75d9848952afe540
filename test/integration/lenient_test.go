package integration

import (
	"path/filepath"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/envoyrls/envoy-rls/internal/redistest"
)

// lenientFiles are files the reference's checker accepts and envoy-rls
// refuses natively (the rows of README's difference table), by name.
var lenientFiles = map[string]string{
	// the domain and a unit given twice: the last ones count (1 per hour)
	"dup.yaml": "domain: old\ndomain: dup\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: minute\n      requests_per_unit: 1\n      unit: hour\n",
	// no requests_per_unit: 0, every request denied
	"deny.yaml": "domain: deny\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute}\n",
	// unlimited with a count: unlimited
	"unl.yaml": "domain: unl\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, requests_per_unit: 1}\n",
	// fields where they mean nothing are ignored (shadow_mode in a
	// rate_limit too: the limit is enforced)
	"misplaced.yaml": "domain: mis\nunit: second\ndescriptors:\n  - key: k\n    requests_per_unit: 4\n    rate_limit: {unit: hour, requests_per_unit: 1, shadow_mode: true}\n",
	// an invalid second document is skipped, the valid ones load
	"multi.yaml": "domain: multi-a\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n---\n" +
		"domain: multi-b\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n---\n" +
		"domain: multi-c\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 2}\n",
}

// lenientWarnings are the warnings each file gives, file:line first.
var lenientWarnings = []string{
	"dup.yaml:2: domain given twice (lines 1 and 2): using the last, as the reference does",
	"dup.yaml:8: unit given twice (lines 6 and 8): using the last, as the reference does",
	"deny.yaml:4: rate limit without requests_per_unit: read as 0, which denies every request, as the reference does",
	"unl.yaml:4: requests_per_unit 1 beside unlimited: true: ignored, as the reference does (the limit is unlimited)",
	"misplaced.yaml:2: unit is not a field of a config: ignored, as the reference does",
	"misplaced.yaml:5: requests_per_unit is not a field of a descriptor: ignored, as the reference does",
	"misplaced.yaml:6: shadow_mode in a rate_limit: ignored, as the reference does",
	"multi.yaml:9: invalid unit",
	"document 2 of the file does not load, so it is skipped (the reference reads only the first document of a file)",
}

// TestReferenceLoadsWhatTheReferenceAccepts: under the reference's
// environment, files the reference's checker accepts and the native format
// refuses load with the reference's meaning, and each thing accepted that
// way is logged once, with file:line.
func TestReferenceLoadsWhatTheReferenceAccepts(t *testing.T) {
	if testing.Short() {
		t.Skip("process-heavy")
	}
	root := filepath.Join(t.TempDir(), "data")
	cm := &configMapDir{dir: filepath.Join(root, "ratelimit", "config")}
	cm.publish(t, lenientFiles)
	rdb := redistest.StartStandalone(t)
	p, debugURL := startReference(t, []string{
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + rdb.Addr(), "USE_STATSD=false",
		"RUNTIME_ROOT=" + root, "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false", "RUNTIME_IGNOREDOTFILES=true",
	})
	ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	p.expectCodes(t, "dup", []string{"k", "v"}, ok, over)
	p.expectCodes(t, "deny", []string{"k", "v"}, over, over)
	p.expectCodes(t, "unl", []string{"k", "v"}, ok, ok, ok)
	p.expectCodes(t, "mis", []string{"k", "v"}, ok, over)
	p.expectCodes(t, "multi-a", []string{"k", "v"}, ok, over)
	p.expectCodes(t, "multi-c", []string{"k", "v"}, ok, ok, over)
	if resp, err := p.callErr(t, "old", "k", "v"); err != nil || resp.OverallCode != ok || len(resp.Statuses) != 1 || resp.Statuses[0].CurrentLimit != nil {
		t.Errorf("domain old (replaced by the second domain field) has a limit: %v %v", resp, err)
	}
	_, body := httpGetCode(debugURL + "/rlconfig")
	for _, want := range []string{"dup.k: unit=HOUR requests_per_unit=1", "deny.k: unit=MINUTE requests_per_unit=0", "mis.k: unit=HOUR requests_per_unit=1, shadow_mode: false"} {
		if !strings.Contains(body, want) {
			t.Errorf("/rlconfig lacks %q:\n%s", want, body)
		}
	}
	if _, metrics := httpGetCode(p.httpURL + "/metrics"); !strings.Contains(metrics, "\nenvoy_rls_config_warnings 8\n") {
		t.Errorf("envoy_rls_config_warnings is not 8:\n%s", grepLines(metrics, "config_warnings"))
	}
	logs := p.Logs()
	for _, w := range lenientWarnings {
		if n := strings.Count(logs, w); n != 1 {
			t.Errorf("warning %q logged %d times, want once:\n%s", w, n, logs)
		}
	}
}

// TestCheckConfigLenient: check-config refuses the same files natively and
// accepts them with --config-lenient, printing each warning as
// file:line: warning: reason.
func TestCheckConfigLenient(t *testing.T) {
	dir := t.TempDir()
	for name, data := range lenientFiles {
		writeFile(t, filepath.Join(dir, name), data)
	}
	_, stderr, code := runBinary(t, nil, "check-config", "--config", dir)
	if code != 1 || !strings.Contains(stderr, filepath.Join(dir, "deny.yaml")+":4: rate limit needs requests_per_unit") {
		t.Errorf("native: exit %d\n%s", code, stderr)
	}
	stdout, stderr, code := runBinary(t, nil, "check-config", "--config", dir, "--config-lenient")
	if code != 0 || !strings.Contains(stdout, "valid (6 domains)") {
		t.Fatalf("lenient: exit %d\n%s%s", code, stdout, stderr)
	}
	for _, w := range []string{
		filepath.Join(dir, "dup.yaml") + ":8: warning: unit given twice (lines 6 and 8)",
		filepath.Join(dir, "multi.yaml") + ":9: warning: invalid unit \"fortnight\"",
	} {
		if !strings.Contains(stderr, w) {
			t.Errorf("lenient: no %q in\n%s", w, stderr)
		}
	}
	_, _, code = runBinary(t, []string{"ENVOY_RLS_CONFIG_LENIENT=true"}, "check-config", "--config", dir)
	if code != 0 {
		t.Errorf("ENVOY_RLS_CONFIG_LENIENT=true: exit %d", code)
	}
}
