package refenv

import (
	"fmt"
	"strings"
	"testing"
)

// Each reference variable set alone changes what it should: a flag, an
// "ignored" entry, or an error naming it.
func TestEveryVariable(t *testing.T) {
	type want struct {
		flag, value string // a setting
		ignored     bool   // reported as having no meaning
		err         string // the start fails with this (it must name the variable)
	}
	base := map[string]string{}
	for _, tc := range []struct {
		env  map[string]string
		want []want
	}{
		{map[string]string{"HOST": "::"}, []want{{flag: "http-addr", value: "[::]:8080"}}},
		{map[string]string{"PORT": "9000"}, []want{{flag: "http-addr", value: "0.0.0.0:9000"}}},
		{map[string]string{"PORT": "x"}, []want{{err: `PORT="x": want an integer`}}},
		{map[string]string{"DEBUG_HOST": "127.0.0.1"}, []want{{flag: "debug-addr", value: "127.0.0.1:6070"}}},
		{map[string]string{"DEBUG_PORT": "7000"}, []want{{flag: "debug-addr", value: "0.0.0.0:7000"}}},
		{map[string]string{"GRPC_HOST": "::"}, []want{{flag: "grpc-addr", value: "[::]:8081"}}},
		{map[string]string{"GRPC_PORT": "9001"}, []want{{flag: "grpc-addr", value: "0.0.0.0:9001"}}},
		{map[string]string{"GRPC_PORT": "70000"}, []want{{err: "GRPC_PORT=70000: want a port"}}},
		{map[string]string{"GRPC_UDS": "/tmp/rls.sock"}, []want{{flag: "grpc-addr", value: "unix:/tmp/rls.sock"}}},
		{map[string]string{"GRPC_MAX_CONNECTION_AGE": "5m"}, []want{{flag: "grpc-max-connection-age", value: "5m0s"}}},
		{map[string]string{"GRPC_MAX_CONNECTION_AGE_GRACE": "30s"}, []want{{flag: "grpc-max-connection-age-grace", value: "30s"}}},
		{map[string]string{"GRPC_MAX_CONNECTION_AGE": "soon"}, []want{{err: "GRPC_MAX_CONNECTION_AGE=\"soon\""}}},
		{map[string]string{"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": "/c", "GRPC_SERVER_TLS_KEY": "/k"},
			[]want{{flag: "grpc-tls-cert", value: "/c"}, {flag: "grpc-tls-key", value: "/k"}}},
		{map[string]string{"GRPC_SERVER_USE_TLS": "true"}, []want{{err: "GRPC_SERVER_USE_TLS=true needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY"}}},
		{map[string]string{"GRPC_SERVER_USE_TLS": "yes please"}, []want{{err: `GRPC_SERVER_USE_TLS="yes please"`}}},
		{map[string]string{"GRPC_SERVER_TLS_CERT": "/c"}, []want{{flag: "GRPC_SERVER_TLS_CERT", ignored: true}}},
		{map[string]string{"GRPC_SERVER_TLS_KEY": "/k"}, []want{{flag: "GRPC_SERVER_TLS_KEY", ignored: true}}},
		{map[string]string{"GRPC_SERVER_USE_TLS": "1", "GRPC_SERVER_TLS_CERT": "/c", "GRPC_SERVER_TLS_KEY": "/k", "GRPC_CLIENT_TLS_CACERT": "/ca"},
			[]want{{flag: "grpc-tls-client-ca", value: "/ca"}}},
		{map[string]string{"GRPC_SERVER_USE_TLS": "1", "GRPC_SERVER_TLS_CERT": "/c", "GRPC_SERVER_TLS_KEY": "/k", "GRPC_SERVER_TLS_CA_CERT": "/eg-ca"},
			[]want{{flag: "grpc-tls-client-ca", value: "/eg-ca"}}},
		{map[string]string{"GRPC_SERVER_USE_TLS": "1", "GRPC_SERVER_TLS_CERT": "/c", "GRPC_SERVER_TLS_KEY": "/k", "GRPC_CLIENT_TLS_CACERT": "/ca", "GRPC_SERVER_TLS_CA_CERT": "/eg-ca"},
			[]want{{flag: "grpc-tls-client-ca", value: "/ca"}, {flag: "GRPC_SERVER_TLS_CA_CERT", ignored: true}}},
		{map[string]string{"GRPC_SERVER_USE_TLS": "1", "GRPC_SERVER_TLS_CERT": "/c", "GRPC_SERVER_TLS_KEY": "/k", "GRPC_CLIENT_TLS_SAN": "envoy"},
			[]want{{flag: "grpc-tls-client-san", value: "envoy"}}},
		{map[string]string{"LOG_LEVEL": "DEBUG"}, []want{{flag: "log-level", value: "debug"}}},
		{map[string]string{"LOG_LEVEL": "trace"}, []want{{flag: "log-level", value: "debug"}}},
		{map[string]string{"LOG_LEVEL": "info"}, []want{{flag: "log-level", value: "info"}}},
		{map[string]string{"LOG_LEVEL": "fatal"}, []want{{flag: "log-level", value: "error"}}},
		{map[string]string{"LOG_LEVEL": "loud"}, []want{{err: `LOG_LEVEL="loud"`}}},
		{map[string]string{"LOG_FORMAT": "json"}, []want{{flag: "log-format", value: "json"}}},
		{map[string]string{"LOG_FORMAT": "xml"}, []want{{err: `LOG_FORMAT="xml"`}}},
		{map[string]string{"RUNTIME_ROOT": "/data"}, []want{{flag: "config", value: "/data/config"}, {flag: "watch-root", value: "/data"}}},
		{map[string]string{"RUNTIME_SUBDIRECTORY": "ratelimit"}, []want{{flag: "config", value: "/srv/runtime_data/current/ratelimit/config"}}},
		{map[string]string{"RUNTIME_APPDIRECTORY": "limits"}, []want{{flag: "config", value: "/srv/runtime_data/current/limits"}}},
		{map[string]string{"RUNTIME_IGNOREDOTFILES": "true"}, []want{{flag: "config-dotfiles"}}},
		{map[string]string{"RUNTIME_IGNOREDOTFILES": "false"}, nil},
		{xds("RUNTIME_IGNOREDOTFILES", "true"), []want{{flag: "RUNTIME_IGNOREDOTFILES", ignored: true}}},
		{map[string]string{"RUNTIME_WATCH_ROOT": "false"}, []want{{flag: "watch-root", value: ""}}},
		{map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW"}, []want{{flag: "config-xds", value: "localhost:18000"}, {flag: "config", value: ""}}},
		{map[string]string{"CONFIG_TYPE": "REST"}, []want{{err: `CONFIG_TYPE="REST"`}}},
		{map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW", "RUNTIME_ROOT": "/data"}, []want{{flag: "RUNTIME_ROOT", ignored: true}}},
		{map[string]string{"CONFIG_GRPC_XDS_SERVER_URL": "cp:1"}, []want{{flag: "CONFIG_GRPC_XDS_SERVER_URL", ignored: true}}},
		{xds("CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway:18001"), []want{{flag: "config-xds", value: "envoy-gateway:18001"}}},
		{xds("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"), []want{{flag: "xds-node-id", value: "envoy-ratelimit"}}},
		{xds("CONFIG_GRPC_XDS_NODE_METADATA", "a=1,b=2"), []want{{flag: "xds-node-metadata", value: "a=1,b=2"}}},
		{xds("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "x-a:1,x-b:2"), []want{{flag: "xds-headers", value: "x-a:1,x-b:2"}}},
		{xds("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "nocolon"), []want{{err: "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS"}}},
		{xds("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "1s"), []want{{flag: "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", ignored: true}}},
		{xds("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"), []want{{flag: "xds-tls", value: "true"}}},
		{xds("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/c"), []want{{flag: "xds-tls-cert", value: "/c"}}},
		{xds("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true", "CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "/k"), []want{{flag: "xds-tls-key", value: "/k"}}},
		{xds("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true", "CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/ca"), []want{{flag: "xds-tls-ca", value: "/ca"}}},
		{xds("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true", "CONFIG_GRPC_XDS_SERVER_TLS_SAN", "envoy-gateway"), []want{{flag: "xds-tls-server-name", value: "envoy-gateway"}}},
		{xds("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/c"), []want{{flag: "CONFIG_GRPC_XDS_CLIENT_TLS_CERT", ignored: true}}},
		{xds("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "1s"), []want{{flag: "xds-backoff-initial", value: "1s"}}},
		{xds("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "2m"), []want{{flag: "xds-backoff-max", value: "2m0s"}}},
		{xds("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "0.1"), []want{{flag: "xds-backoff-random-factor", value: "0.1"}}},
		{xds("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "2"), []want{{err: "XDS_CLIENT_BACKOFF_RANDOM_FACTOR=2"}}},
		{xds("XDS_CLIENT_BACKOFF_JITTER", "false"), []want{{flag: "xds-backoff-jitter", value: "false"}}},
		{xds("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "8388608"), []want{{flag: "xds-max-message-size", value: "8388608"}}},
		{xds("FORCE_START_WITHOUT_INITIAL_CONFIG", "false"), []want{{flag: "force-start-without-initial-config"}}},
		{map[string]string{"MERGE_DOMAIN_CONFIG": "true"}, []want{{flag: "merge-domain-config", value: "true"}}},
		{map[string]string{"MERGE_DOMAIN_CONFIG": "maybe"}, []want{{err: `MERGE_DOMAIN_CONFIG="maybe"`}}},
		{map[string]string{"HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED": "true"}, []want{{flag: "health-requires-config", value: "true"}}},
		{map[string]string{"USE_STATSD": "true"}, []want{{err: "USE_STATSD=true is not supported"}}},
		{map[string]string{"USE_STATSD": "false"}, nil},
		{map[string]string{"USE_DOG_STATSD": "true"}, []want{{err: "USE_DOG_STATSD=true is not supported"}}},
		{map[string]string{"USE_PROMETHEUS": "true"}, []want{{flag: "metrics-addr", value: ":9090"}, {flag: "metrics-path", value: "/metrics"}, {flag: "reference-metrics", value: "true"}}},
		{map[string]string{"USE_PROMETHEUS": "true", "PROMETHEUS_ADDR": ":19001"}, []want{{flag: "metrics-addr", value: ":19001"}}},
		{map[string]string{"USE_PROMETHEUS": "true", "PROMETHEUS_PATH": "/m"}, []want{{flag: "metrics-path", value: "/m"}}},
		{map[string]string{"USE_PROMETHEUS": "true", "PROMETHEUS_MAPPER_YAML": "/etc/statsd-exporter/conf.yaml"}, []want{{flag: "PROMETHEUS_MAPPER_YAML", ignored: true}}},
		{map[string]string{"PROMETHEUS_ADDR": ":19001"}, []want{{flag: "PROMETHEUS_ADDR", ignored: true}}},
		{map[string]string{"NEAR_LIMIT_RATIO": "0.5"}, []want{{flag: "near-limit-ratio", value: "0.5"}}},
		{map[string]string{"NEAR_LIMIT_RATIO": "5"}, []want{{err: "NEAR_LIMIT_RATIO=5"}}},
		{map[string]string{"BACKEND_TYPE": "memcache"}, []want{{err: "BACKEND_TYPE=memcache is not supported"}}},
		{map[string]string{"BACKEND_TYPE": "etcd"}, []want{{err: `BACKEND_TYPE="etcd"`}}},
		{map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "redis:6379"}, []want{{flag: "redis-url", value: "redis://redis:6379"}}},
		// A host:port under the default unix socket type says what to set.
		{map[string]string{"REDIS_URL": "redis:6379"}, []want{{err: `REDIS_URL="redis:6379" is a host:port, but REDIS_SOCKET_TYPE is unix (its default), which wants a socket path: set REDIS_SOCKET_TYPE=tcp`}}},
		{map[string]string{"REDIS_SOCKET_TYPE": "unix", "REDIS_URL": "10.0.0.7:6379"}, []want{{err: `REDIS_SOCKET_TYPE is unix (set so), which wants a socket path: set REDIS_SOCKET_TYPE=tcp`}}},
		{map[string]string{"REDIS_PERSECOND": "true", "REDIS_PERSECOND_URL": "rps:6380", "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "r:1"}, []want{{err: "set REDIS_PERSECOND_SOCKET_TYPE=tcp"}}},
		{map[string]string{"REDIS_URL": "/run/redis.sock"}, []want{{flag: "redis-url", value: "unix:///run/redis.sock"}}},
		{map[string]string{"REDIS_SOCKET_TYPE": "udp"}, []want{{err: `REDIS_SOCKET_TYPE="udp"`}}},
		{map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "a:1,b:2"}, []want{{err: "a list needs REDIS_TYPE=SENTINEL or CLUSTER"}}},
		{map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "r:6379", "REDIS_AUTH": "user:p@ss"}, []want{{flag: "redis-url", value: "redis://user:p%40ss@r:6379"}}},
		{map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "r:6379", "REDIS_AUTH": "secret"}, []want{{flag: "redis-url", value: "redis://:secret@r:6379"}}},
		{map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "r:6379", "REDIS_TLS": "true"}, []want{{flag: "redis-url", value: "rediss://r:6379"}}},
		{map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "r:1", "REDIS_TLS": "true", "REDIS_TLS_CLIENT_CERT": "/rc"}, []want{{flag: "redis-tls-cert-file", value: "/rc"}}},
		{map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "r:1", "REDIS_TLS": "true", "REDIS_TLS_CLIENT_KEY": "/rk"}, []want{{flag: "redis-tls-key-file", value: "/rk"}}},
		{map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "r:1", "REDIS_TLS": "true", "REDIS_TLS_CACERT": "/rca"}, []want{{flag: "redis-tls-ca-file", value: "/rca"}}},
		{map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "r:1", "REDIS_TLS": "true", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION": "true"}, []want{{flag: "redis-tls-insecure-skip-verify", value: "true"}}},
		{map[string]string{"REDIS_TLS_CACERT": "/rca"}, []want{{flag: "REDIS_TLS_CACERT", ignored: true}}},
		{map[string]string{"REDIS_TLS": "true"}, []want{{err: "REDIS_TLS=true is not supported by envoy-rls: TLS over a unix socket"}}},
		{map[string]string{"REDIS_TYPE": "sentinel", "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "mymaster,s1:26379,s2:26379"},
			[]want{{flag: "redis-sentinel-master", value: "mymaster"}, {flag: "redis-sentinel", value: "s1:26379,s2:26379"}}},
		{map[string]string{"REDIS_TYPE": "SENTINEL", "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "s1:26379"}, []want{{err: "REDIS_TYPE=SENTINEL wants master,host:port"}}},
		{map[string]string{"REDIS_TYPE": "SENTINEL", "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "m,s1:1", "REDIS_SENTINEL_AUTH": "sp"}, []want{{flag: "redis-sentinel-password", value: "sp"}}},
		{map[string]string{"REDIS_SENTINEL_AUTH": "sp"}, []want{{flag: "REDIS_SENTINEL_AUTH", ignored: true}}},
		{map[string]string{"REDIS_TYPE": "CLUSTER", "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "n1:7000,n2:7000"}, []want{{flag: "redis-cluster", value: "n1:7000,n2:7000"}}},
		{map[string]string{"REDIS_TYPE": "CLUSTER", "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "n1:7000,n2:7000", "REDIS_AUTH": "pw"}, []want{{flag: "redis-url", value: "redis://:pw@n1:7000"}}},
		{map[string]string{"REDIS_TYPE": "RING"}, []want{{err: `REDIS_TYPE="RING"`}}},
		{map[string]string{"REDIS_POOL_SIZE": "20"}, []want{{flag: "redis-pool-size", value: "20"}}},
		{map[string]string{"REDIS_POOL_SIZE": "0"}, []want{{err: "REDIS_POOL_SIZE=0"}}},
		{map[string]string{"REDIS_TIMEOUT": "2s"}, []want{{flag: "redis-dial-timeout", value: "2s"}, {flag: "redis-read-timeout", value: "2s"}, {flag: "redis-write-timeout", value: "2s"}}},
		{map[string]string{"REDIS_PIPELINE_WINDOW": "150us"}, []want{{flag: "redis-batch-window", value: "150µs"}}},
		{map[string]string{"REDIS_PIPELINE_LIMIT": "8"}, []want{{flag: "redis-batch-size", value: "8"}}},
		{map[string]string{"REDIS_PERSECOND": "true"}, []want{{flag: "redis-persecond-url", value: "unix:///var/run/nutcracker/ratelimitpersecond.sock"}}},
		{map[string]string{"REDIS_PERSECOND": "false", "REDIS_PERSECOND_URL": "ps:1"}, []want{{flag: "REDIS_PERSECOND_URL", ignored: true}}},
		{perSecond("REDIS_PERSECOND_SOCKET_TYPE", "tcp", "REDIS_PERSECOND_URL", "ps:6380"), []want{{flag: "redis-persecond-url", value: "redis://ps:6380"}}},
		{perSecond("REDIS_PERSECOND_URL", "/run/ps.sock"), []want{{flag: "redis-persecond-url", value: "unix:///run/ps.sock"}}},
		{perSecond("REDIS_PERSECOND_SOCKET_TYPE", "udp"), []want{{err: `REDIS_PERSECOND_SOCKET_TYPE="udp"`}}},
		{perSecond("REDIS_PERSECOND_SOCKET_TYPE", "tcp", "REDIS_PERSECOND_URL", "a:1,b:2"), []want{{err: "a list needs REDIS_PERSECOND_TYPE=SENTINEL or CLUSTER"}}},
		{perSecond("REDIS_PERSECOND_SOCKET_TYPE", "tcp", "REDIS_PERSECOND_URL", "ps:1", "REDIS_PERSECOND_AUTH", "user:pw"), []want{{flag: "redis-persecond-url", value: "redis://user:pw@ps:1"}}},
		{perSecond("REDIS_PERSECOND_SOCKET_TYPE", "tcp", "REDIS_PERSECOND_URL", "ps:1", "REDIS_PERSECOND_TLS", "true"), []want{{flag: "redis-persecond-url", value: "rediss://ps:1"}}},
		{perSecond("REDIS_PERSECOND_SOCKET_TYPE", "tcp", "REDIS_PERSECOND_URL", "ps:1", "REDIS_PERSECOND_TLS", "true", "REDIS_TLS_CACERT", "/rca"),
			[]want{{flag: "redis-persecond-tls-ca-file", value: "/rca"}, {flag: "redis-tls-ca-file", value: ""}}},
		{perSecond("REDIS_PERSECOND_SOCKET_TYPE", "tcp", "REDIS_PERSECOND_URL", "ps:1", "REDIS_PERSECOND_TLS", "true", "REDIS_TLS_CLIENT_CERT", "/rc", "REDIS_TLS_CLIENT_KEY", "/rk"),
			[]want{{flag: "redis-persecond-tls-cert-file", value: "/rc"}, {flag: "redis-persecond-tls-key-file", value: "/rk"}}},
		{perSecond("REDIS_PERSECOND_SOCKET_TYPE", "tcp", "REDIS_PERSECOND_URL", "ps:1", "REDIS_PERSECOND_TLS", "true", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "true"),
			[]want{{flag: "redis-persecond-tls-insecure-skip-verify", value: "true"}}},
		{perSecond("REDIS_PERSECOND_TLS", "true"), []want{{err: "REDIS_PERSECOND_TLS=true is not supported by envoy-rls: TLS over a unix socket"}}},
		{perSecond("REDIS_PERSECOND_TYPE", "SENTINEL", "REDIS_PERSECOND_SOCKET_TYPE", "tcp", "REDIS_PERSECOND_URL", "psmaster,s1:26379,s2:26379"),
			[]want{{flag: "redis-persecond-sentinel-master", value: "psmaster"}, {flag: "redis-persecond-sentinel", value: "s1:26379,s2:26379"}}},
		{perSecond("REDIS_PERSECOND_TYPE", "SENTINEL", "REDIS_PERSECOND_SOCKET_TYPE", "tcp", "REDIS_PERSECOND_URL", "s1:26379"), []want{{err: "REDIS_PERSECOND_TYPE=SENTINEL wants master,host:port"}}},
		{perSecond("REDIS_PERSECOND_TYPE", "SENTINEL", "REDIS_PERSECOND_SOCKET_TYPE", "tcp", "REDIS_PERSECOND_URL", "m,s1:1", "REDIS_PERSECOND_SENTINEL_AUTH", "sp"),
			[]want{{flag: "redis-persecond-sentinel-password", value: "sp"}, {flag: "redis-sentinel-password", value: ""}}},
		{perSecond("REDIS_PERSECOND_SENTINEL_AUTH", "sp"), []want{{flag: "REDIS_PERSECOND_SENTINEL_AUTH", ignored: true}}},
		{perSecond("REDIS_PERSECOND_TYPE", "cluster", "REDIS_PERSECOND_SOCKET_TYPE", "tcp", "REDIS_PERSECOND_URL", "n1:7000,n2:7000"), []want{{flag: "redis-persecond-cluster", value: "n1:7000,n2:7000"}}},
		{perSecond("REDIS_PERSECOND_TYPE", "RING"), []want{{err: `REDIS_PERSECOND_TYPE="RING"`}}},
		{perSecond("REDIS_PERSECOND_POOL_SIZE", "20"), []want{{flag: "redis-persecond-pool-size", value: "20"}}},
		{perSecond("REDIS_PERSECOND_POOL_SIZE", "0"), []want{{err: "REDIS_PERSECOND_POOL_SIZE=0"}}},
		{perSecond("REDIS_PERSECOND_TIMEOUT", "2s"), []want{{flag: "redis-persecond-dial-timeout", value: "2s"}, {flag: "redis-persecond-read-timeout", value: "2s"}, {flag: "redis-persecond-write-timeout", value: "2s"}}},
		{perSecond("REDIS_PERSECOND_PIPELINE_WINDOW", "150us"), []want{{flag: "redis-persecond-batch-window", value: "150µs"}}},
		{perSecond("REDIS_PERSECOND_PIPELINE_LIMIT", "8"), []want{{flag: "redis-persecond-batch-size", value: "8"}}},
		{perSecond("REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM", "4"), []want{{flag: "REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM", ignored: true}}},
		{perSecond("REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR", "WAIT"), []want{{flag: "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR", ignored: true}}},
		{map[string]string{"REDIS_PERSECOND_URL": "x"}, []want{{flag: "REDIS_PERSECOND_URL", ignored: true}}},
		{map[string]string{"CACHE_KEY_PREFIX": "eg_"}, []want{{flag: "key-prefix", value: "eg_"}}},
		{map[string]string{"LOCAL_CACHE_SIZE_IN_BYTES": "0"}, []want{{flag: "local-deny-cache", value: "false"}}},
		{map[string]string{"LOCAL_CACHE_SIZE_IN_BYTES": "1048576"}, []want{{flag: "local-deny-cache", value: "true"}}},
		{map[string]string{"SHADOW_MODE": "true"}, []want{{flag: "shadow-mode", value: "true"}}},
		{map[string]string{"QUOTA_MODE": "true"}, []want{{flag: "quota-mode", value: "true"}}},
		{map[string]string{"RESPONSE_DYNAMIC_METADATA": "true"}, []want{{flag: "response-dynamic-metadata", value: "true"}}},
		{map[string]string{"LIMIT_RESPONSE_HEADERS_ENABLED": "true"}, []want{{flag: "response-headers", value: "true"}}},
		{map[string]string{"LIMIT_LIMIT_HEADER": "X-Limit"}, []want{{flag: "response-headers-limit-name", value: "X-Limit"}}},
		{map[string]string{"LIMIT_REMAINING_HEADER": "ratelimit-remaining"}, []want{{flag: "response-headers-remaining-name", value: "ratelimit-remaining"}}},
		{map[string]string{"LIMIT_RESET_HEADER": "X-Reset"}, []want{{flag: "response-headers-reset-name", value: "X-Reset"}}},
		{map[string]string{"LIMIT_RESET_HEADER": "X Reset"}, []want{{err: `LIMIT_RESET_HEADER="X Reset": want an HTTP header name`}}},
		{map[string]string{"MEMCACHE_HOST_PORT": "m:11211"}, []want{{flag: "MEMCACHE_HOST_PORT", ignored: true}}},
		{map[string]string{"EXPIRATION_JITTER_MAX_SECONDS": "10"}, []want{{flag: "EXPIRATION_JITTER_MAX_SECONDS", ignored: true}}},
		{map[string]string{"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT": "true"}, []want{{flag: "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", ignored: true}}},
		{map[string]string{"STATSD_HOST": "x"}, []want{{flag: "STATSD_HOST", ignored: true}}},
	} {
		name := ""
		for k, v := range tc.env {
			name += k + "=" + v + " "
		}
		t.Run(name, func(t *testing.T) {
			before, err := Translate(FromMap(base))
			if err != nil {
				t.Fatal(err)
			}
			got, err := Translate(FromMap(tc.env))
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("error %v", err)
				}
				for _, s := range got.Settings {
					if b, _ := before.Lookup(s.Flag); b.Value != s.Value {
						t.Fatalf("%s changed from %q to %q", s.Flag, b.Value, s.Value)
					}
				}
				return
			}
			for _, w := range tc.want {
				switch {
				case w.err != "":
					if err == nil || !strings.Contains(err.Error(), w.err) {
						t.Fatalf("error %v, want it to contain %q", err, w.err)
					}
				case w.ignored:
					found := false
					for _, ig := range got.Ignored {
						found = found || ig.Var == w.flag
					}
					if !found || err != nil {
						t.Fatalf("%s not reported as ignored (%v; err %v)", w.flag, got.Ignored, err)
					}
				default:
					if err != nil {
						t.Fatal(err)
					}
					s, ok := got.Lookup(w.flag)
					if w.value == "" {
						if ok {
							t.Fatalf("%s = %q, want unset", w.flag, s.Value)
						}
						continue
					}
					if !ok || s.Value != w.value {
						t.Fatalf("%s = %q (set %v), want %q", w.flag, s.Value, ok, w.value)
					}
					if b, _ := before.Lookup(w.flag); b.Value == w.value {
						t.Fatalf("%s is %q without the variable too: the case tests nothing", w.flag, w.value)
					}
					if s.From == "reference default" {
						t.Fatalf("%s does not name its variable", w.flag)
					}
				}
			}
		})
	}
}

// perSecond is an environment with REDIS_PERSECOND=true and kv.
func perSecond(kv ...string) map[string]string {
	m := map[string]string{"REDIS_PERSECOND": "true"}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

func xds(kv ...string) map[string]string {
	m := map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW"}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

// egEnv is the environment Envoy Gateway renders for the rate limit
// Deployment (expectedRateLimitContainerEnv), Prometheus and Redis TLS on.
func egEnv() map[string]string {
	return map[string]string{
		"RUNTIME_ROOT": "/data", "RUNTIME_SUBDIRECTORY": "ratelimit", "RUNTIME_IGNOREDOTFILES": "true", "RUNTIME_WATCH_ROOT": "false",
		"LOG_LEVEL": "info", "USE_STATSD": "false",
		"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL": "envoy-gateway:18001", "CONFIG_GRPC_XDS_NODE_ID": "envoy-ratelimit",
		"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": "/certs/tls.crt", "GRPC_SERVER_TLS_KEY": "/certs/tls.key", "GRPC_SERVER_TLS_CA_CERT": "/certs/ca.crt",
		"CONFIG_GRPC_XDS_SERVER_USE_TLS": "true", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT": "/certs/tls.crt", "CONFIG_GRPC_XDS_CLIENT_TLS_KEY": "/certs/tls.key", "CONFIG_GRPC_XDS_SERVER_TLS_CACERT": "/certs/ca.crt",
		"FORCE_START_WITHOUT_INITIAL_CONFIG": "true",
		"REDIS_SOCKET_TYPE":                  "tcp", "REDIS_URL": "redis.redis-system.svc.cluster.local:6379",
		"REDIS_TLS": "true", "REDIS_TLS_CLIENT_CERT": "/redis-certs/tls.crt", "REDIS_TLS_CLIENT_KEY": "/redis-certs/tls.key",
		"USE_PROMETHEUS": "true", "PROMETHEUS_ADDR": ":19001", "PROMETHEUS_MAPPER_YAML": "/etc/statsd-exporter/conf.yaml",
		"TRACING_ENABLED": "true", "TRACING_SERVICE_NAME": "envoy-ratelimit", "TRACING_SAMPLING_RATE": "0.5",
		"OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel:4317",
	}
}

func TestEnvoyGatewayEnvironment(t *testing.T) {
	res, err := Translate(FromMap(egEnv()))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"http-addr": "0.0.0.0:8080", "grpc-addr": "0.0.0.0:8081", "debug-addr": "0.0.0.0:6070",
		"log-level": "info", "config-xds": "envoy-gateway:18001", "xds-node-id": "envoy-ratelimit",
		"grpc-tls-cert": "/certs/tls.crt", "grpc-tls-key": "/certs/tls.key", "grpc-tls-client-ca": "/certs/ca.crt",
		"xds-tls": "true", "xds-tls-cert": "/certs/tls.crt", "xds-tls-key": "/certs/tls.key", "xds-tls-ca": "/certs/ca.crt",
		"force-start-without-initial-config": "true", "backend": "redis",
		"redis-url": "rediss://redis.redis-system.svc.cluster.local:6379", "redis-tls-cert-file": "/redis-certs/tls.crt", "redis-tls-key-file": "/redis-certs/tls.key",
		"metrics-addr": ":19001", "metrics-path": "/metrics", "reference-metrics": "true",
	}
	for f, v := range want {
		if s, ok := res.Lookup(f); !ok || s.Value != v {
			t.Errorf("%s = %q, want %q", f, s.Value, v)
		}
	}
	if s, ok := res.Lookup("config"); ok {
		t.Errorf("config = %q under CONFIG_TYPE=GRPC_XDS_SOTW", s.Value)
	}
	ignored := map[string]bool{}
	for _, ig := range res.Ignored {
		ignored[ig.Var] = true
	}
	for _, v := range []string{"RUNTIME_ROOT", "RUNTIME_SUBDIRECTORY", "RUNTIME_WATCH_ROOT", "RUNTIME_IGNOREDOTFILES", "PROMETHEUS_MAPPER_YAML"} {
		if !ignored[v] {
			t.Errorf("%s is not reported as ignored", v)
		}
	}
}

// Istio's sample (samples/ratelimit/rate-limit-service.yaml): file config
// from a ConfigMap at /data/ratelimit/config.
func TestIstioEnvironment(t *testing.T) {
	res, err := Translate(FromMap(map[string]string{
		"LOG_LEVEL": "debug", "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "redis.default.svc.cluster.local:6379",
		"USE_STATSD": "false", "RUNTIME_ROOT": "/data", "RUNTIME_SUBDIRECTORY": "ratelimit",
		"RUNTIME_WATCH_ROOT": "false", "RUNTIME_IGNOREDOTFILES": "true", "HOST": "::", "GRPC_HOST": "::",
	}))
	if err != nil {
		t.Fatal(err)
	}
	for f, v := range map[string]string{
		"config": "/data/ratelimit/config", "http-addr": "[::]:8080", "grpc-addr": "[::]:8081",
		"redis-url": "redis://redis.default.svc.cluster.local:6379", "log-level": "debug",
	} {
		if s, ok := res.Lookup(f); !ok || s.Value != v {
			t.Errorf("%s = %q, want %q", f, s.Value, v)
		}
	}
	if s, ok := res.Lookup("watch-root"); ok {
		t.Errorf("watch-root = %q with RUNTIME_WATCH_ROOT=false", s.Value)
	}
	if s, ok := res.Lookup("config-xds"); ok {
		t.Errorf("config-xds = %q under file config", s.Value)
	}
}

// Every variable of the reference's settings.go is known: setting it to
// some value changes a flag, is reported as ignored, fails, or is read
// elsewhere (tracing).
func TestEveryReferenceVariableIsKnown(t *testing.T) {
	handled := map[string]bool{}
	for _, v := range handledElsewhere {
		handled[v] = true
	}
	for _, v := range vars {
		if handled[v] {
			continue
		}
		found := false
		for _, val := range []string{"true", "x:1", "7", "/p"} {
			for _, extra := range []map[string]string{nil, {"CONFIG_TYPE": "GRPC_XDS_SOTW"}, {"USE_PROMETHEUS": "true"}} {
				env := map[string]string{v: val}
				for k, x := range extra {
					if k != v {
						env[k] = x
					}
				}
				base, _ := Translate(FromMap(extra))
				res, err := Translate(FromMap(env))
				if err != nil && strings.Contains(err.Error(), v) {
					found = true
				}
				for _, ig := range res.Ignored {
					found = found || ig.Var == v
				}
				for _, s := range res.Settings {
					if b, _ := base.Lookup(s.Flag); b.Value != s.Value || strings.Contains(s.From, v) {
						found = true
					}
				}
			}
		}
		if !found {
			t.Errorf("%s: no value changes anything, is reported as ignored, or fails", v)
		}
	}
}

// TestFileSourceAsReference: under CONFIG_TYPE=FILE the directory is read as
// the reference's runtime loader reads it (every file, subdirectories,
// dotfiles unless RUNTIME_IGNOREDOTFILES) and the server starts when it does
// not load; over xDS only FORCE_START_WITHOUT_INITIAL_CONFIG starts it early.
func TestFileSourceAsReference(t *testing.T) {
	res, err := Translate(FromMap(map[string]string{"RUNTIME_ROOT": "/data", "RUNTIME_SUBDIRECTORY": "ratelimit"}))
	if err != nil {
		t.Fatal(err)
	}
	for flag, want := range map[string]string{
		"config": "/data/ratelimit/config", "config-recursive": "true", "config-all-files": "true",
		"config-dotfiles": "true", "force-start-without-initial-config": "true",
	} {
		if s, _ := res.Lookup(flag); s.Value != want {
			t.Errorf("%s = %q, want %q", flag, s.Value, want)
		}
	}
	res, err = Translate(FromMap(xds("FORCE_START_WITHOUT_INITIAL_CONFIG", "true")))
	if err != nil {
		t.Fatal(err)
	}
	if s, _ := res.Lookup("force-start-without-initial-config"); s.Value != "true" || s.From != "FORCE_START_WITHOUT_INITIAL_CONFIG" {
		t.Errorf("xDS force start: %+v", s)
	}
	for _, flag := range []string{"config-recursive", "config-all-files", "config-dotfiles"} {
		if s, ok := res.Lookup(flag); ok {
			t.Errorf("xDS sets %s=%q", flag, s.Value)
		}
	}
}

// The variables that choose the store or the config source are REDIS_*,
// BACKEND_TYPE, CONFIG_TYPE and RUNTIME_*, each reported with what does
// its work natively; names that platforms set (PORT, HOST, LOG_LEVEL) and
// the reference's other variables are not among them.
func TestSelectors(t *testing.T) {
	for _, v := range vars {
		want := v == "BACKEND_TYPE" || v == "CONFIG_TYPE" || strings.HasPrefix(v, "REDIS_") || strings.HasPrefix(v, "RUNTIME_")
		got := Selectors(FromMap(map[string]string{v: "1"}))
		if want != (len(got) == 1) || (want && (got[0].Var != v || got[0].Use == "")) {
			t.Errorf("%s: selectors %+v, want it reported: %v", v, got, want)
		}
	}
	got := Selectors(FromMap(map[string]string{"PORT": "8080", "HOST": "h", "LOG_LEVEL": "debug",
		"REDIS_URL": "r:6379", "REDIS_SOCKET_TYPE": "tcp", "REDIS_TIMEOUT": "2s", "BACKEND_TYPE": "redis"}))
	want := []Selector{
		{"BACKEND_TYPE", "--backend"},
		{"REDIS_SOCKET_TYPE", "--redis-url"},
		{"REDIS_TIMEOUT", "--redis-dial-timeout, --redis-read-timeout, --redis-write-timeout"},
		{"REDIS_URL", "--redis-url"},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("selectors %+v, want %+v", got, want)
	}
}
