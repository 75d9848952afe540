package main

import (
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/envoyrls/envoy-rls/internal/refenv"
	"github.com/envoyrls/envoy-rls/pkg/descriptors"
	"github.com/envoyrls/envoy-rls/pkg/rlheaders"
	"github.com/envoyrls/envoy-rls/pkg/rls"
)

// withEnv makes the reference environment m for the test.
func withEnv(t *testing.T, m map[string]string) {
	t.Helper()
	old := lookupEnv
	lookupEnv = refenv.FromMap(m)
	t.Cleanup(func() { lookupEnv = old })
}

// Envoy Gateway's environment becomes these options.
func TestReferenceEnvironmentEnvoyGateway(t *testing.T) {
	withEnv(t, map[string]string{
		"RUNTIME_ROOT": "/data", "RUNTIME_SUBDIRECTORY": "ratelimit", "RUNTIME_IGNOREDOTFILES": "true", "RUNTIME_WATCH_ROOT": "false",
		"LOG_LEVEL": "info", "USE_STATSD": "false", "CONFIG_TYPE": "GRPC_XDS_SOTW",
		"CONFIG_GRPC_XDS_SERVER_URL": "envoy-gateway:18001", "CONFIG_GRPC_XDS_NODE_ID": "envoy-ratelimit",
		"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": "/certs/tls.crt", "GRPC_SERVER_TLS_KEY": "/certs/tls.key", "GRPC_SERVER_TLS_CA_CERT": "/certs/ca.crt",
		"CONFIG_GRPC_XDS_SERVER_USE_TLS": "true", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT": "/certs/tls.crt", "CONFIG_GRPC_XDS_CLIENT_TLS_KEY": "/certs/tls.key",
		"CONFIG_GRPC_XDS_SERVER_TLS_CACERT": "/certs/ca.crt", "FORCE_START_WITHOUT_INITIAL_CONFIG": "true",
		"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "redis.redis-system.svc.cluster.local:6379",
		"USE_PROMETHEUS": "true", "PROMETHEUS_ADDR": ":19001", "PROMETHEUS_MAPPER_YAML": "/etc/statsd-exporter/conf.yaml",
	})
	o, err := parseServe(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.reference == nil || o.Source.Config != "" || o.Source.ConfigXDS != "envoy-gateway:18001" || o.Source.XDS.NodeID != "envoy-ratelimit" ||
		!o.Source.XDS.TLS || o.Source.XDS.TLSCert != "/certs/tls.crt" || o.Source.XDS.TLSCA != "/certs/ca.crt" || !o.Source.ForceStart || !o.Source.Load.ConfigLenient ||
		o.GRPCTLS.Cert != "/certs/tls.crt" || o.GRPCTLS.ClientCA != "/certs/ca.crt" ||
		o.Listen.GRPCAddr != "0.0.0.0:8081" || o.Listen.HTTPAddr != "0.0.0.0:8080" || o.Listen.DebugAddr != "0.0.0.0:6070" ||
		o.Listen.MetricsAddr != ":19001" || !o.Obs.ReferenceMetrics || o.Obs.LogLevel != logLevel(slog.LevelInfo) ||
		o.Backend != "redis" || o.Redis.Main.RedisURL.String() != "redis://redis.redis-system.svc.cluster.local:6379" || o.Redis.Main.RedisPoolSize != 10 || o.Redis.Main.RedisDialTimeout != 10*time.Second ||
		o.Decisions.UsageAccounting != descriptors.UsageAuto {
		t.Fatalf("options = %+v", o)
	}
}

// The reference has no setting for usage accounting: under its environment
// (the config over xDS, which cannot say it) ENVOY_RLS_USAGE_ACCOUNTING
// chooses, and the default is auto.
func TestUsageAccountingUnderTheReferenceEnvironment(t *testing.T) {
	withEnv(t, map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL": "envoy-gateway:18001", "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "r:1"})
	for _, v := range []string{"always", "never", "auto"} {
		t.Setenv("ENVOY_RLS_USAGE_ACCOUNTING", v)
		o, err := parseServe(nil, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if o.reference == nil || o.Source.ConfigXDS == "" || o.Decisions.UsageAccounting.String() != v {
			t.Fatalf("ENVOY_RLS_USAGE_ACCOUNTING=%s: reference %v, xds %q, usage accounting %v", v, o.reference != nil, o.Source.ConfigXDS, o.Decisions.UsageAccounting)
		}
	}
}

// The reference has no consistency either: under its environment (the
// config over xDS) ENVOY_RLS_CONSISTENCY chooses for every limit, and the
// default is strict; a value that is not a consistency is refused.
func TestConsistencyUnderTheReferenceEnvironment(t *testing.T) {
	withEnv(t, map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL": "envoy-gateway:18001", "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "r:1"})
	o, err := parseServe(nil, io.Discard)
	if err != nil || o.Decisions.Consistency != descriptors.ConsistencyStrict {
		t.Fatalf("default: consistency %v, %v", o.Decisions.Consistency, err)
	}
	for _, v := range []string{"lease", "approximate", "strict"} {
		t.Setenv("ENVOY_RLS_CONSISTENCY", v)
		o, err := parseServe(nil, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if o.reference == nil || o.Source.ConfigXDS == "" || o.Decisions.Consistency.String() != v {
			t.Fatalf("ENVOY_RLS_CONSISTENCY=%s: reference %v, xds %q, consistency %v", v, o.reference != nil, o.Source.ConfigXDS, o.Decisions.Consistency)
		}
	}
	t.Setenv("ENVOY_RLS_CONSISTENCY", "eventual")
	if _, err := parseServe(nil, io.Discard); err == nil || !strings.Contains(err.Error(), "strict, lease or approximate") {
		t.Fatalf("ENVOY_RLS_CONSISTENCY=eventual: %v", err)
	}
}

// Native flags and ENVOY_RLS_* variables win over the reference's.
func TestNativeSettingsWin(t *testing.T) {
	withEnv(t, map[string]string{"RUNTIME_ROOT": "/data", "GRPC_PORT": "9000", "LOG_LEVEL": "debug", "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "r:1"})
	t.Setenv("ENVOY_RLS_LOG_LEVEL", "error")
	o, err := parseServe([]string{"--grpc-addr", "127.0.0.1:1"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.Listen.GRPCAddr != "127.0.0.1:1" || o.Obs.LogLevel != logLevel(slog.LevelError) || o.Source.Config != "/data/config" || o.Source.WatchRoot != "/data" {
		t.Fatalf("options = %+v", o)
	}
	// With --config the reference environment is not read at all; its
	// variables that choose the store or the config source are refused
	// rather than ignored.
	_, err = parseServe([]string{"--config", "/etc/rls"}, io.Discard)
	for _, want := range []string{"--config is given", "REDIS_URL (natively: --redis-url)",
		"REDIS_SOCKET_TYPE (natively: --redis-url)", "RUNTIME_ROOT (natively: --config, --watch-root)"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("with --config beside REDIS_* and RUNTIME_*: error %v, want %q", err, want)
		}
	}
	withEnv(t, map[string]string{"GRPC_PORT": "9000", "LOG_LEVEL": "debug"})
	o, err = parseServe([]string{"--config", "/etc/rls"}, io.Discard)
	if err != nil || o.reference != nil || o.Listen.GRPCAddr != ":8081" || o.Backend != "memory" {
		t.Fatalf("with --config: %+v, %v", o, err)
	}
}

// The case: REDIS_URL=... BACKEND_TYPE=redis envoy-rls serve
// --config ... ran on the memory store without a word. Set beside --config
// or --config-xds (as flags or ENVOY_RLS_* variables), the reference's
// store- and config-selecting variables are refused with the native flag
// to use.
func TestReferenceSelectorsBesideNativeConfigAreRefused(t *testing.T) {
	for _, c := range []struct {
		args []string
		env  map[string]string // ENVOY_RLS_* variables
		ref  map[string]string
		want []string
	}{
		{[]string{"--config", "/etc/rls"}, nil,
			map[string]string{"REDIS_URL": "redis:6379", "REDIS_SOCKET_TYPE": "tcp", "BACKEND_TYPE": "redis"},
			[]string{"--config is given", "BACKEND_TYPE (natively: --backend)", "REDIS_URL (natively: --redis-url)", "leave out --config"}},
		{nil, map[string]string{"ENVOY_RLS_CONFIG": "/etc/rls"},
			map[string]string{"REDIS_URL": "redis:6379"},
			[]string{"ENVOY_RLS_CONFIG (--config) is given", "REDIS_URL (natively: --redis-url)"}},
		{[]string{"--config-xds", "cp:18000"}, nil,
			map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW", "RUNTIME_ROOT": "/data"},
			[]string{"--config-xds is given", "CONFIG_TYPE (natively: --config (FILE) or --config-xds (GRPC_XDS_SOTW))", "RUNTIME_ROOT (natively: no flag: CONFIG_TYPE is GRPC_XDS_SOTW)"}},
		{[]string{"--config", "/etc/rls"}, nil,
			map[string]string{"REDIS_PERSECOND": "true", "REDIS_PERSECOND_URL": "ps:6379", "REDIS_PERSECOND_SOCKET_TYPE": "tcp", "REDIS_POOL_ON_EMPTY_BEHAVIOR": "WAIT"},
			[]string{"REDIS_PERSECOND (natively: --redis-persecond-url)", "REDIS_PERSECOND_URL (natively: --redis-persecond-url)",
				"REDIS_POOL_ON_EMPTY_BEHAVIOR (natively: no flag: calls wait for a connection within their deadline)"}},
	} {
		t.Run(c.want[0], func(t *testing.T) {
			withEnv(t, c.ref)
			for k, v := range c.env {
				t.Setenv(k, v)
			}
			_, err := parseServe(c.args, io.Discard)
			for _, want := range c.want {
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("%v %v beside %v: error %v, want %q", c.env, c.args, c.ref, err, want)
				}
			}
		})
	}
}

// Names that platforms set for their own reasons (PORT, HOST, LOG_LEVEL)
// and the reference's other variables never refuse a native start, and are
// not read by it.
func TestGenericNamesBesideNativeConfig(t *testing.T) {
	withEnv(t, map[string]string{"PORT": "8080", "HOST": "pod-1", "LOG_LEVEL": "debug", "GRPC_PORT": "9000", "USE_STATSD": "true", "SHADOW_MODE": "true"})
	o, err := parseServe([]string{"--config", "/etc/rls"}, io.Discard)
	if err != nil {
		t.Fatalf("generic names beside --config: %v", err)
	}
	if o.reference != nil || o.Listen.HTTPAddr != ":8080" || o.Listen.GRPCAddr != ":8081" || o.Obs.LogLevel != logLevel(slog.LevelInfo) {
		t.Fatalf("the reference's environment was read beside --config: %+v", o)
	}
}

func TestReferenceEnvironmentErrorsNameTheVariable(t *testing.T) {
	for env, want := range map[string]string{
		"BACKEND_TYPE=memcache": "BACKEND_TYPE=memcache is not supported",
		"REDIS_TLS=true":        "REDIS_TLS=true is not supported",
		"USE_STATSD=true":       "USE_STATSD=true is not supported",
		"GRPC_PORT=x":           `GRPC_PORT="x"`,
	} {
		k, v, _ := strings.Cut(env, "=")
		withEnv(t, map[string]string{k: v})
		_, err := parseServe(nil, io.Discard)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want %q", env, err, want)
		}
	}
}

// Under Envoy Gateway, GRPC_SERVER_TLS_CA_CERT turns client verification
// on; an empty ENVOY_RLS_GRPC_TLS_CLIENT_CA turns it off again (server-only
// TLS, as the reference itself runs there).
func TestClientVerificationOptOut(t *testing.T) {
	withEnv(t, map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW", "GRPC_SERVER_USE_TLS": "true",
		"GRPC_SERVER_TLS_CERT": "/certs/tls.crt", "GRPC_SERVER_TLS_KEY": "/certs/tls.key", "GRPC_SERVER_TLS_CA_CERT": "/certs/ca.crt",
		"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "r:1"})
	o, err := parseServe(nil, io.Discard)
	if err != nil || o.GRPCTLS.ClientCA != "/certs/ca.crt" {
		t.Fatalf("client CA = %q, %v", o.GRPCTLS.ClientCA, err)
	}
	t.Setenv("ENVOY_RLS_GRPC_TLS_CLIENT_CA", "")
	o, err = parseServe(nil, io.Discard)
	if err != nil || o.GRPCTLS.ClientCA != "" || o.GRPCTLS.Cert != "/certs/tls.crt" {
		t.Fatalf("opt-out: client CA = %q, cert %q, %v", o.GRPCTLS.ClientCA, o.GRPCTLS.Cert, err)
	}
}

// The reference's mode switches land on the flags they name.
func TestReferenceModes(t *testing.T) {
	withEnv(t, map[string]string{"RUNTIME_ROOT": "/data", "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "r:1",
		"LIMIT_RESPONSE_HEADERS_ENABLED": "true", "SHADOW_MODE": "true", "NEAR_LIMIT_RATIO": "0.5", "CACHE_KEY_PREFIX": "p_"})
	o, err := parseServe(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.Response.Headers != rls.HeadersLegacy || !o.Decisions.ShadowMode || o.Obs.NearLimitRatio != 0.5 || o.Redis.KeyPrefix != "p_" {
		t.Fatalf("headers %v shadow %v near %v prefix %q", o.Response.Headers, o.Decisions.ShadowMode, o.Obs.NearLimitRatio, o.Redis.KeyPrefix)
	}
}

// The reference's file loading, merging, quota mode and header names become
// options (every flag refenv sets exists in this build).
func TestReferenceEnvironmentFilesAndModes(t *testing.T) {
	withEnv(t, map[string]string{
		"RUNTIME_ROOT": "/data", "RUNTIME_SUBDIRECTORY": "ratelimit", "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "r:1",
		"MERGE_DOMAIN_CONFIG": "true", "QUOTA_MODE": "true", "LIMIT_RESPONSE_HEADERS_ENABLED": "true",
		"LIMIT_LIMIT_HEADER": "X-Limit", "LIMIT_REMAINING_HEADER": "X-Remaining", "LIMIT_RESET_HEADER": "X-Reset",
	})
	o, err := parseServe(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	lo := o.Source.Load.descriptorOptions()
	if o.Source.Config != "/data/ratelimit/config" || !lo.Recursive || !lo.AllFiles || !lo.Dotfiles || !lo.MergeDomains || !lo.Lenient ||
		!o.Source.ForceStart || !o.Decisions.QuotaMode || o.Response.Headers != rls.HeadersLegacy ||
		o.Response.legacyNames() != (rlheaders.LegacyNames{Limit: "X-Limit", Remaining: "X-Remaining", Reset: "X-Reset"}) {
		t.Fatalf("options = %+v", o)
	}
	// Native defaults: envoy-rls's own layout, fail fast (the reference's
	// variables unset: beside --config they are refused).
	withEnv(t, nil)
	o, err = parseServe([]string{"--config", "/etc/rls"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if lo := o.Source.Load.descriptorOptions(); lo != (descriptors.Options{}) || o.Source.ForceStart || o.Response.legacyNames() != rlheaders.DefaultLegacyNames {
		t.Fatalf("native defaults = %+v", o)
	}
	// Lenient natively on request, by flag or variable (check-config too).
	t.Setenv("ENVOY_RLS_CONFIG_LENIENT", "true")
	if o, err = parseServe([]string{"--config", "/etc/rls"}, io.Discard); err != nil || !o.Source.Load.descriptorOptions().Lenient {
		t.Fatalf("ENVOY_RLS_CONFIG_LENIENT: %+v, %v", o, err)
	}
	if co, err := parseCheck([]string{"--config", "/etc/rls"}, io.Discard); err != nil || !co.lo.descriptorOptions().Lenient {
		t.Fatalf("check-config with ENVOY_RLS_CONFIG_LENIENT: %+v, %v", co, err)
	}
	t.Setenv("ENVOY_RLS_CONFIG_LENIENT", "")
	if co, err := parseCheck([]string{"--config", "/etc/rls", "--config-lenient"}, io.Discard); err != nil || !co.lo.descriptorOptions().Lenient {
		t.Fatalf("check-config --config-lenient: %+v, %v", co, err)
	}
	// Header names must be field names and differ.
	for _, args := range [][]string{
		{"--response-headers-limit-name", "X Limit"},
		{"--response-headers-reset-name", "ratelimit-limit"},
	} {
		if _, err := parseServe(append([]string{"--config", "/etc/rls"}, args...), io.Discard); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}
