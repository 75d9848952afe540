package main

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/envoyrls/envoy-rls/internal/testutil"
)

// busyAddr holds a loopback port for the test and returns its address.
func busyAddr(t *testing.T) (addr, port string) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	_, port, _ = net.SplitHostPort(lis.Addr().String())
	return lis.Addr().String(), port
}

// A listen address taken by another process stops the start with what to
// change: the flag and its variable, or the reference's variables that
// set it.
func TestListenErrorsNameWhatToChange(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(cfg, []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	busy, busyPort := busyAddr(t)
	free := func() string { return testutil.FreeAddr(t) }
	withEnv(t, nil)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"grpc", []string{"--grpc-addr", busy, "--http-addr", free()}, "change --grpc-addr (env ENVOY_RLS_GRPC_ADDR) to a free address"},
		{"http", []string{"--grpc-addr", free(), "--http-addr", busy}, "change --http-addr (env ENVOY_RLS_HTTP_ADDR) to a free address"},
		{"debug", []string{"--grpc-addr", free(), "--http-addr", free(), "--debug-addr", busy}, "change --debug-addr (env ENVOY_RLS_DEBUG_ADDR) to a free address"},
		{"metrics", []string{"--grpc-addr", free(), "--http-addr", free(), "--metrics-addr", busy}, "change --metrics-addr (env ENVOY_RLS_METRICS_ADDR) to a free address"},
	} {
		o, err := parseServe(append([]string{"--config", cfg}, tc.args...), io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		err = serve(context.Background(), o, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), busy) {
			t.Errorf("%s: error %v, want it to name %s and say %q", tc.name, err, busy, tc.want)
		}
	}

	// The reference's environment: GRPC_PORT (or GRPC_HOST) to change.
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "rl", "config"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "rl", "config", "c.yaml"), []byte("domain: d\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	port := func() string { return strconv.Itoa(testutil.FreePort(t)) }
	withEnv(t, map[string]string{
		"RUNTIME_ROOT": dir, "RUNTIME_SUBDIRECTORY": "rl", "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "127.0.0.1:1",
		"HOST": "127.0.0.1", "PORT": port(), "DEBUG_HOST": "127.0.0.1", "DEBUG_PORT": port(),
		"GRPC_HOST": "127.0.0.1", "GRPC_PORT": busyPort,
	})
	o, err := parseServe(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	err = serve(context.Background(), o, io.Discard)
	if want := "the address comes from the reference's GRPC_HOST and GRPC_PORT (--grpc-addr): change GRPC_HOST or GRPC_PORT"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("reference environment: error %v, want %q", err, want)
	}
}
