package main

import (
	"errors"
	"io"
	"strings"
	"testing"
	"time"
)

func TestFlagsFromEnvironmentAndCommandLine(t *testing.T) {
	t.Setenv("ENVOY_RLS_CONFIG", "/etc/rls")
	t.Setenv("ENVOY_RLS_BACKEND", "redis")
	t.Setenv("ENVOY_RLS_REDIS_CLUSTER", "a:1, b:2,")
	t.Setenv("ENVOY_RLS_BACKEND_TIMEOUT", "25ms")
	t.Setenv("ENVOY_RLS_GRPC_ADDR", ":9999")
	t.Setenv("ENVOY_RLS_GRPC_MAX_CONNECTIONS", "12")
	t.Setenv("ENVOY_RLS_GRPC_MAX_CONNECTION_IDLE", "90s")
	t.Setenv("ENVOY_RLS_GRPC_STREAM_WORKERS", "0")
	o, err := parseServe([]string{"--grpc-addr", "127.0.0.1:1"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.Source.Config != "/etc/rls" || o.Backend != "redis" || o.Failure.BackendTimeout != 25*time.Millisecond {
		t.Fatalf("environment not applied: %+v", o)
	}
	if o.Listen.GRPCMaxConnections != 12 || o.Listen.GRPCMaxConnectionIdle != 90*time.Second || o.Listen.GRPCStreamWorkers != 0 {
		t.Fatalf("gRPC bounds from the environment: %d, %v, %d workers", o.Listen.GRPCMaxConnections, o.Listen.GRPCMaxConnectionIdle, o.Listen.GRPCStreamWorkers)
	}
	if o.Listen.GRPCAddr != "127.0.0.1:1" {
		t.Fatalf("command line must win over the environment: %q", o.Listen.GRPCAddr)
	}
	if got := o.Redis.Main.RedisCluster; len(got) != 2 || got[0] != "a:1" || got[1] != "b:2" {
		t.Fatalf("cluster list %q", got)
	}
}

func TestFlagValidation(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--config", "x", "--config-xds", "cp:1"}, "exclude each other"},
		{[]string{"--config-xds", "cp:1", "--xds-tls-cert", "c"}, "--xds-tls-cert and --xds-tls-key go together"},
		{[]string{"--config", "x", "--grpc-tls-client-ca", "ca"}, "--grpc-tls-client-ca needs --grpc-tls-cert"},
		{[]string{"--config-xds", "cp:1", "--xds-headers", "novalue"}, "--xds-headers"},
		{[]string{"--config", "x", "--backend", "redis"}, "needs --redis-url, --redis-sentinel or --redis-cluster"},
		{[]string{"--config", "x", "--backend", "redis", "--redis-sentinel", "a:1"}, "go together"},
		{[]string{"--config", "x", "--backend", "redis", "--redis-sentinel", "a:1", "--redis-sentinel-master", "m", "--redis-cluster", "b:1"}, "exclude each other"},
		{[]string{"--config", "x", "--failure-mode", "maybe"}, "--failure-mode"},
		{[]string{"--config", "x", "--backend", "etcd"}, "want memory or redis"},
		{[]string{"--config", "x", "--max-keys", "0"}, "--max-keys"},
		{[]string{"--config", "x", "--grpc-max-connections", "0"}, "--grpc-max-connections must be at least 1"},
		{[]string{"--config", "x", "--http-max-connections", "-1"}, "--http-max-connections must be at least 1"},
		{[]string{"--config", "x", "--grpc-stream-workers", "-1"}, "--grpc-stream-workers must be 0 to 65536"},
		{[]string{"--config", "x", "--grpc-stream-workers", "65537"}, "--grpc-stream-workers must be 0 to 65536"},
		{[]string{"--config", "x", "--grpc-max-connection-idle", "0s"}, "--grpc-max-connection-idle must be positive"},
		{[]string{"--config", "x", "--log-level", "loud"}, "--log-level"},
		{[]string{"--config", "x", "stray"}, "unexpected argument"},
		{[]string{"--config", "x", "--redis-url", "ftp://h:1"}, "want redis://"},
		{[]string{"--config", "x", "--redis-url", "redis://h:1/notadb"}, "--redis-url"},
		{[]string{"--config", "x", "--redis-cluster", "a:1,b"}, `"b": address b: missing port in address (want HOST:PORT[,HOST:PORT...])`},
		{[]string{"--config", "x", "--redis-sentinel", "a:http", "--redis-sentinel-master", "m"}, "port \"http\" is not a number"},
		{[]string{"--config", "x", "--redis-cluster", ":6379"}, "no host"},
	} {
		_, err := parseServe(tc.args, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: got %v, want an error containing %q", tc.args, err, tc.want)
		}
	}
	if _, err := parseServe([]string{"--config", "x", "--backend", "redis", "--redis-url", "redis://h:1"}, io.Discard); err != nil {
		t.Errorf("valid redis flags: %v", err)
	}
	// --redis-url is read as the reference reads REDIS_URL, once, when the
	// flag is set: host:port and a socket path get their scheme.
	for in, want := range map[string]string{
		"h:1":                    "redis://h:1",
		"/run/redis.sock":        "unix:///run/redis.sock",
		"rediss://u:p@h:1/2":     "rediss://u:p@h:1/2",
		"redis://h:1?protocol=3": "redis://h:1?protocol=3",
	} {
		o, err := parseServe([]string{"--config", "x", "--redis-url", in, "--redis-cluster", " a:1, ,b:2 "}, io.Discard)
		if err != nil {
			t.Fatalf("--redis-url %s: %v", in, err)
		}
		if o.Redis.Main.RedisURL.String() != want {
			t.Errorf("--redis-url %s read as %q, want %q", in, o.Redis.Main.RedisURL.String(), want)
		}
		if len(o.Redis.Main.RedisCluster) != 2 || o.Redis.Main.RedisCluster[0] != "a:1" || o.Redis.Main.RedisCluster[1] != "b:2" {
			t.Errorf("--redis-cluster read as %q", o.Redis.Main.RedisCluster)
		}
	}
}

func TestBadEnvironmentValueNamesTheVariable(t *testing.T) {
	t.Setenv("ENVOY_RLS_MAX_KEYS", "lots")
	_, err := parseServe([]string{"--config", "x"}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "ENVOY_RLS_MAX_KEYS") {
		t.Fatalf("got %v", err)
	}
}

// serve -h lists every flag under a topic, in serveTopics' order: the
// everyday ones first.
func TestServeHelpTopics(t *testing.T) {
	var b strings.Builder
	o, err := parseServe([]string{"-h"}, &b)
	if !errors.Is(err, errHelp) {
		t.Fatalf("-h: %v", err)
	}
	var titles []string
	for _, s := range o.cmd.helpSections() {
		titles = append(titles, s.title)
	}
	if strings.Join(titles, ",") != strings.Join(serveTopics, ",") {
		t.Errorf("topics %q, want %q (every flag under one)", titles, serveTopics)
	}
	help := b.String()
	if i, j := strings.Index(help, "\nConfig source:\n  --config "), strings.Index(help, "\nListeners:\n  --grpc-addr "); i < 0 || j < i {
		t.Errorf("-h does not begin with --config, then --grpc-addr:\n%s", help)
	}
}
