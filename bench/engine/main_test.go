package main

import (
	"os"
	"strings"
	"testing"
)

func TestParseLoadReadsTheLoadToolsReport(t *testing.T) {
	txt := `target 127.0.0.1:1 domain bench key user keys 10000 concurrency 50 conns 4
calls 30000 in 2.5s: 12000 calls/s (ok 30000, over_limit 0, errors 0)
latency p50 2.1ms p90 3ms p99 8.5ms max 20ms
`
	var sm sample
	if err := parseLoad(txt, &sm); err != nil {
		t.Fatal(err)
	}
	if sm.calls != 30000 || sm.rps != 12000 || sm.p50 != 2100 || sm.p99 != 8500 || sm.errs != 0 || sm.over != 0 {
		t.Fatalf("parsed %+v", sm)
	}
	if err := parseLoad(strings.Replace(txt, "latency", "lat", 1), &sm); err == nil {
		t.Fatal("a report without latencies was accepted")
	}
}

func TestParseLoadCountsDenialsAndErrors(t *testing.T) {
	txt := "calls 10 in 1s: 10 calls/s (ok 7, over_limit 2, errors 1)\nlatency p50 1ms p90 1ms p99 1ms max 1ms\n"
	var sm sample
	if err := parseLoad(txt, &sm); err != nil {
		t.Fatal(err)
	}
	if sm.over != 2 || sm.errs != 1 {
		t.Fatalf("over %d errs %d, want 2 and 1", sm.over, sm.errs)
	}
}

func TestMedianAndFlags(t *testing.T) {
	if m := median([]float64{3, 1, 2}); m != 2 {
		t.Fatalf("median = %v", m)
	}
	if m := median([]float64{4, 1, 2, 3}); m != 2.5 {
		t.Fatalf("median = %v", m)
	}
	if _, err := parse([]string{"--systems", "memory"}); err == nil {
		t.Fatal("a run without the floor was accepted")
	}
	o, err := parse([]string{"--ref-bin", "", "--keys", "5,zipf7,1"})
	if err != nil || len(o.keys) != 3 || o.keys[0] != (scenario{keys: 5}) || o.keys[1] != (scenario{keys: 7, zipf: zipfS}) ||
		o.keys[2] != (scenario{keys: 1}) || len(o.systems) != 5 || o.systems[3] != "lease" || o.systems[4] != "approximate" {
		t.Fatalf("parse = %+v, %v", o, err)
	}
	// An A/B run: redis-b only when asked for, with its own binary and flags.
	o, err = parse([]string{"--systems", "floor,redis,redis-b", "--redis-b-bin", "/tmp/b/envoy-rls", "--redis-b-args", "--redis-pipelines=2", "-v"})
	if err != nil || len(o.systems) != 3 || o.systems[2] != "redis-b" || o.binB != "/tmp/b/envoy-rls" || o.extraArgsB != "--redis-pipelines=2" || !o.verbose {
		t.Fatalf("parse = %+v, %v", o, err)
	}
	if _, err := parse([]string{"--systems", "floor,redis-c"}); err == nil {
		t.Fatal("an unknown system was accepted")
	}
}

func TestParseStatSplitsIdleAndSteal(t *testing.T) {
	idle, total, steal, err := parseStat("cpu  100 5 50 800 20 1 4 10 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n")
	if err != nil {
		t.Fatal(err)
	}
	if idle != 820 || total != 990 || steal != 10 {
		t.Fatalf("idle %v total %v steal %v, want 820, 990, 10", idle, total, steal)
	}
	if _, _, _, err := parseStat("intr 1 2 3\n"); err == nil {
		t.Fatal("a stat file without the cpu line was accepted")
	}
}

func TestProcFieldReadsIoAndStatus(t *testing.T) {
	io := []byte("rchar: 10\nwchar: 20\nsyscr: 7\nsyscw: 9\n")
	if v, err := procField(io, "syscr"); err != nil || v != 7 {
		t.Fatalf("syscr = %v, %v", v, err)
	}
	st := []byte("Name:\tx\nvoluntary_ctxt_switches:\t12\nnonvoluntary_ctxt_switches:\t3\n")
	if v, err := procField(st, "voluntary_ctxt_switches"); err != nil || v != 12 {
		t.Fatalf("voluntary = %v, %v", v, err)
	}
	if _, err := procField(io, "syscx"); err == nil {
		t.Fatal("a missing field was found")
	}
}

func TestCountsOfThisProcess(t *testing.T) {
	a, err := countsOf(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.ReadFile("/proc/self/stat"); err != nil {
		t.Fatal(err)
	}
	b, err := countsOf(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if b.reads <= a.reads || a.switches <= 0 {
		t.Fatalf("reads %v -> %v, switches %v: the counts do not move", a.reads, b.reads, a.switches)
	}
}
