package main

import (
	"io"
	"strings"
	"testing"
	"time"
)

// The --redis-persecond-* flags mirror the --redis-* flags: same parsing
// (a reference-style host:port URL, address lists), same defaults, and
// ENVOY_RLS_REDIS_PERSECOND_* variables.
func TestPerSecondFlags(t *testing.T) {
	t.Setenv("ENVOY_RLS_REDIS_PERSECOND_POOL_SIZE", "7")
	o, err := parseServe([]string{"--config", "x", "--redis-url", "main:6379", "--redis-persecond-url", "persecond:6380",
		"--redis-persecond-read-timeout", "250ms"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.Backend != "redis" || o.Redis.Main.RedisURL.String() != "redis://main:6379" {
		t.Fatalf("main redis: backend %q url %q", o.Backend, o.Redis.Main.RedisURL.String())
	}
	ps := o.Redis.PerSecond
	if !ps.enabled() || ps.RedisURL.String() != "redis://persecond:6380" || ps.RedisPoolSize != 7 || ps.RedisReadTimeout != 250*time.Millisecond {
		t.Fatalf("per-second redis: %+v", ps)
	}
	if ps.RedisBatchSize != o.Redis.Main.RedisBatchSize || ps.RedisPipelines != o.Redis.Main.RedisPipelines || ps.RedisDialTimeout != o.Redis.Main.RedisDialTimeout {
		t.Errorf("per-second defaults differ from the main ones: %+v vs %+v", ps, o.Redis.Main)
	}
	if o.Redis.Main.RedisPoolSize != 0 || o.Redis.Main.RedisReadTimeout == 250*time.Millisecond {
		t.Errorf("per-second flags leaked into the main Redis: %+v", o.Redis.Main)
	}

	o, err = parseServe([]string{"--config", "x", "--redis-cluster", "a:1,b:2", "--redis-persecond-sentinel", "s1:26379,s2:26379",
		"--redis-persecond-sentinel-master", "ps", "--redis-persecond-sentinel-password", "pw"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if ps := o.Redis.PerSecond; ps.mode() != "sentinel" || len(ps.RedisSentinel) != 2 || ps.RedisSentinelMaster != "ps" || ps.RedisSentinelPassword != "pw" || o.Redis.Main.mode() != "cluster" {
		t.Fatalf("per-second sentinel next to a main cluster: %+v", o.Redis.PerSecond)
	}
}

// Bad per-second settings stop the start with a message naming the flag.
func TestPerSecondFlagValidation(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--redis-persecond-url", "ps:1"}, "--redis-persecond-url applies to the redis backend"},
		{[]string{"--backend", "memory", "--redis-persecond-url", "ps:1"}, "--redis-persecond-url applies to the redis backend"},
		{[]string{"--redis-url", "m:1", "--redis-persecond-pool-size", "3"}, "--redis-persecond-pool-size applies to the per-second Redis, which needs --redis-persecond-url, --redis-persecond-sentinel or --redis-persecond-cluster"},
		{[]string{"--redis-url", "m:1", "--redis-persecond-sentinel", "s:1"}, "--redis-persecond-sentinel and --redis-persecond-sentinel-master go together"},
		{[]string{"--redis-url", "m:1", "--redis-persecond-sentinel", "s:1", "--redis-persecond-sentinel-master", "x", "--redis-persecond-cluster", "c:1"}, "--redis-persecond-sentinel and --redis-persecond-cluster exclude each other"},
		{[]string{"--redis-url", "m:1", "--redis-persecond-url", "ps:1", "--redis-persecond-tls-ca-file", "/ca"}, "--redis-persecond-tls-* flags need a rediss:// --redis-persecond-url"},
		{[]string{"--redis-url", "m:1", "--redis-persecond-url", "ps:1", "--redis-persecond-batch-size", "0"}, "--redis-persecond-batch-size must be at least 1"},
		{[]string{"--redis-url", "m:1", "--redis-persecond-cluster", "nohost"}, "--redis-persecond-cluster"},
	} {
		_, err := parseServe(append([]string{"--config", "x"}, tc.args...), io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want it to contain %q", tc.args, err, tc.want)
		}
	}
}

// -h lists the per-second flags, saying what they are for.
func TestPerSecondFlagsInHelp(t *testing.T) {
	var b strings.Builder
	if _, err := parseServe([]string{"-h"}, &b); err == nil {
		t.Fatal("-h: no errHelp")
	}
	for _, f := range []string{"-redis-persecond-url", "-redis-persecond-sentinel-master", "-redis-persecond-tls-insecure-skip-verify", "per-second Redis (counters of limits of a second or less)"} {
		if !strings.Contains(b.String(), f) {
			t.Errorf("help lacks %q", f)
		}
	}
}

// The reference's REDIS_PERSECOND=true with its REDIS_PERSECOND_*
// variables becomes the per-second Redis's flags, sharing REDIS_TLS_*'s
// files; a native flag wins.
func TestReferencePerSecondEnvironment(t *testing.T) {
	withEnv(t, map[string]string{
		"RUNTIME_ROOT": "/data", "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "redis:6379",
		"REDIS_PERSECOND": "true", "REDIS_PERSECOND_SOCKET_TYPE": "tcp", "REDIS_PERSECOND_TYPE": "SENTINEL",
		"REDIS_PERSECOND_URL": "ps-master,sentinel-0:26379,sentinel-1:26379", "REDIS_PERSECOND_AUTH": "pw",
		"REDIS_PERSECOND_SENTINEL_AUTH": "spw", "REDIS_PERSECOND_TLS": "true", "REDIS_TLS_CACERT": "/certs/ca.crt",
		"REDIS_PERSECOND_POOL_SIZE": "4", "REDIS_PERSECOND_TIMEOUT": "3s",
	})
	o, err := parseServe([]string{"--redis-persecond-batch-size", "16"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ps := o.Redis.PerSecond
	if o.Redis.Main.RedisURL.String() != "redis://redis:6379" || o.Redis.Main.RedisTLSCAFile != "" || !ps.enabled() ||
		ps.RedisURL.String() != "rediss://:pw@sentinel-0:26379" || ps.RedisSentinelMaster != "ps-master" ||
		strings.Join(ps.RedisSentinel, ",") != "sentinel-0:26379,sentinel-1:26379" || ps.RedisSentinelPassword != "spw" ||
		ps.RedisTLSCAFile != "/certs/ca.crt" || ps.RedisPoolSize != 4 || ps.RedisReadTimeout != 3*time.Second || ps.RedisBatchSize != 16 {
		t.Fatalf("per-second redis from the reference's environment: %+v", ps)
	}
}

// The per-second Redis takes every setting of the main Redis it does not
// override: pool size, timeouts, batching, pipelines and the TLS files
// (not with a plain redis:// URL of its own), never the main servers or
// the name verified in their certificates.
func TestPerSecondInheritsTheMainRedis(t *testing.T) {
	o, err := parseServe([]string{"--config", "x", "--redis-url", "rediss://main:6379", "--redis-persecond-url", "rediss://ps:6380",
		"--redis-pool-size", "50", "--redis-read-timeout", "3s", "--redis-batch-window", "200us", "--redis-pipelines", "2",
		"--redis-tls-ca-file", "/ca.pem", "--redis-tls-server-name", "main.internal", "--redis-persecond-pool-size", "5"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ps := o.Redis.PerSecond
	if ps.RedisURL.String() != "rediss://ps:6380" || ps.RedisPoolSize != 5 || ps.RedisReadTimeout != 3*time.Second ||
		ps.RedisBatchWindow != 200*time.Microsecond || ps.RedisPipelines != 2 || ps.RedisTLSCAFile != "/ca.pem" || ps.RedisTLSServerName != "" {
		t.Fatalf("per-second redis: %+v", ps)
	}
	if m := o.Redis.Main; m.RedisPoolSize != 50 || m.RedisTLSServerName != "main.internal" {
		t.Fatalf("main redis: %+v", m)
	}
	// A plain per-second URL says no TLS: the main Redis's TLS files are
	// not taken (nor refused for want of rediss://).
	o, err = parseServe([]string{"--config", "x", "--redis-url", "rediss://main:6379", "--redis-tls-ca-file", "/ca.pem",
		"--redis-persecond-url", "redis://ps:6380"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if ps := o.Redis.PerSecond; ps.redisTLSOn() || ps.RedisURL.tls() {
		t.Fatalf("plain per-second redis took TLS: %+v", ps)
	}
	// A bad value the per-second Redis took is told once, by the flag that
	// set it.
	_, err = parseServe([]string{"--config", "x", "--redis-url", "m:1", "--redis-persecond-url", "ps:1", "--redis-batch-size", "0"}, io.Discard)
	if err == nil || err.Error() != "--redis-batch-size must be at least 1" {
		t.Fatalf("inherited bad value: %v", err)
	}
	_, err = parseServe([]string{"--config", "x", "--redis-url", "rediss://m:1", "--redis-tls-cert-file", "c.pem", "--redis-tls-key-file", "k.pem",
		"--redis-persecond-url", "rediss://ps:1", "--redis-persecond-tls-key-file", ""}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "--redis-tls-cert-file and --redis-persecond-tls-key-file go together") {
		t.Fatalf("per-second override of an inherited pair: %v", err)
	}
}

// The per-second flags the reference's variables do not carry are
// deprecated: they still work, are listed apart in -h, and a start with one
// warns, unless the reference's environment set it.
func TestPerSecondDeprecatedFlags(t *testing.T) {
	o, err := parseServe([]string{"--config", "x", "--redis-url", "m:1", "--redis-persecond-url", "ps:1", "--redis-persecond-pipelines", "3"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.Redis.PerSecond.RedisPipelines != 3 || o.Redis.Main.RedisPipelines == 3 {
		t.Fatalf("--redis-persecond-pipelines: per-second %d, main %d", o.Redis.PerSecond.RedisPipelines, o.Redis.Main.RedisPipelines)
	}
	w := o.warnings(nil)
	if len(w) != 1 || w[0] != "--redis-persecond-pipelines is deprecated: the per-second Redis takes --redis-pipelines's value" {
		t.Fatalf("warnings %q", w)
	}
	var b strings.Builder
	_, _ = parseServe([]string{"-h"}, &b)
	help := b.String()
	if i, j := strings.Index(help, "\nDeprecated:\n"), strings.Index(help, "--redis-persecond-pipelines "); i < 0 || j < i {
		t.Errorf("--redis-persecond-pipelines not under Deprecated in -h")
	}

	withEnv(t, map[string]string{"RUNTIME_ROOT": "/data", "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "redis:6379",
		"REDIS_PERSECOND": "true", "REDIS_PERSECOND_SOCKET_TYPE": "tcp", "REDIS_PERSECOND_URL": "ps:6380", "REDIS_PERSECOND_TLS": "true",
		"REDIS_TLS_CACERT": "/certs/ca.crt"})
	if o, err = parseServe(nil, io.Discard); err != nil {
		t.Fatal(err)
	}
	if o.Redis.PerSecond.RedisTLSCAFile != "/certs/ca.crt" {
		t.Fatalf("per-second CA from REDIS_TLS_CACERT: %q", o.Redis.PerSecond.RedisTLSCAFile)
	}
	if w := o.warnings(nil); len(w) != 0 {
		t.Fatalf("warnings under the reference's environment: %q", w)
	}
}
