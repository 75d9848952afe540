package main

import (
	"io"
	"strings"
	"testing"
)

func TestParseSize(t *testing.T) {
	for _, c := range []struct {
		in   string
		want uint64
	}{
		{"1048576", 1 << 20}, {"256MiB", 256 << 20}, {"256mib", 256 << 20}, {"1GB", 1e9}, {"1 GiB", 1 << 30},
		{"64KiB", 64 << 10}, {"64kB", 64e3}, {"1.5GiB", 3 << 29}, {"512B", 512}, {"2TiB", 2 << 40}, {" 7 ", 7},
	} {
		got, err := parseSize(c.in)
		if err != nil || got != c.want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", c.in, got, err, c.want)
		}
	}
	for _, in := range []string{"", "MiB", "lots", "1k", "-1MiB", "0x10", "1.5B", "NaN", "Inf", "99999999TiB", "1e30"} {
		if got, err := parseSize(in); err == nil {
			t.Errorf("parseSize(%q) = %d, want an error", in, got)
		}
	}
	for v, want := range map[uint64]string{256 << 20: "256MiB", 64 << 10: "64KiB", 1000: "1000", 3 << 30: "3GiB"} {
		if got := formatSize(v); got != want {
			t.Errorf("formatSize(%d) = %q, want %q", v, got, want)
		}
	}
}

// TestMemoryBoundFlags reads --max-memory, --penalty-keys and
// --grpc-max-recv-msg-size from the command line and the environment, and
// refuses bad values with the flag's name.
func TestMemoryBoundFlags(t *testing.T) {
	o, err := parseServe([]string{"--config", "x"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.Memory.MaxMemory != 256<<20 || o.Memory.PenaltyKeys != 100_000 || o.Listen.GRPCMaxRecvMsgSize != 64<<10 {
		t.Fatalf("defaults: --max-memory %d --penalty-keys %d --grpc-max-recv-msg-size %d", o.Memory.MaxMemory, o.Memory.PenaltyKeys, o.Listen.GRPCMaxRecvMsgSize)
	}
	t.Setenv("ENVOY_RLS_MAX_MEMORY", "1GB")
	o, err = parseServe([]string{"--config", "x", "--penalty-keys", "0", "--grpc-max-recv-msg-size", "1MiB"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.Memory.MaxMemory != 1e9 || o.Memory.PenaltyKeys != 0 || o.Listen.GRPCMaxRecvMsgSize != 1<<20 {
		t.Fatalf("got --max-memory %d --penalty-keys %d --grpc-max-recv-msg-size %d", o.Memory.MaxMemory, o.Memory.PenaltyKeys, o.Listen.GRPCMaxRecvMsgSize)
	}
	// With Redis, they bound the fallback store of --failure-mode local.
	o, err = parseServe([]string{"--config", "x", "--redis-url", "redis://h:1", "--max-keys", "500", "--max-memory", "64MiB", "--penalty-keys", "7"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.Memory.MaxKeys != 500 || o.Memory.MaxMemory != 64<<20 || o.Memory.PenaltyKeys != 7 {
		t.Fatalf("redis with local fallback: --max-keys %d --max-memory %d --penalty-keys %d", o.Memory.MaxKeys, o.Memory.MaxMemory, o.Memory.PenaltyKeys)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--max-memory", "lots"}, `--max-memory "lots": want bytes, such as 1048576, 256MiB or 1GB`},
		{[]string{"--max-memory", "1000"}, `--max-memory "1000": want at least 1MiB`},
		{[]string{"--penalty-keys", "-1"}, `--penalty-keys "-1": must not be negative`},
		{[]string{"--grpc-max-recv-msg-size", "2GiB"}, `--grpc-max-recv-msg-size "2GiB": want 1KiB to 1GiB`},
		{[]string{"--max-memory", "1GiB", "--redis-url", "redis://h:1", "--failure-mode", "allow"}, "--max-memory applies to the memory backend and to the fallback store of --failure-mode local; the backend is redis (selected by --redis-url) and the failure mode allow keeps no store"},
		{[]string{"--max-memory", "1KiB", "--redis-url", "redis://h:1"}, `--max-memory "1KiB": want at least 1MiB`},
	} {
		_, err := parseServe(append([]string{"--config", "x"}, c.args...), io.Discard)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: got %v, want an error containing %q", c.args, err, c.want)
		}
	}
}
