// Package refenv reads the environment of the reference rate limit server
// (envoyproxy/ratelimit, src/settings/settings.go) and turns it into
// envoy-rls flag settings, so that envoy-rls runs unchanged where the
// reference runs: Envoy Gateway's Deployment (no arguments, environment
// only) and Istio's sample.
//
// Every variable of the reference is known here (see Vars). Translate maps
// each one that is set to native flags; a variable whose value cannot be
// honoured (BACKEND_TYPE=memcache, USE_STATSD=true, ...) is an error that
// names it; one that has no meaning for envoy-rls is reported in Ignored.
// Variables the reference does not know are not looked at.
package refenv

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Setting is one flag value taken from the reference's environment (or its
// defaults).
type Setting struct {
	Flag  string // the flag name without dashes, e.g. "grpc-addr"
	Value string
	From  string // the variables it comes from, or "reference default"
}

// Ignored is a variable that was set but has no meaning for envoy-rls.
type Ignored struct {
	Var    string
	Reason string
}

// Result is what Translate found.
type Result struct {
	// Settings are flag values in a stable order. A flag appears at most
	// once.
	Settings []Setting
	// Ignored lists the set variables with no meaning here, by name.
	Ignored []Ignored
}

// Lookup reads one environment variable, like os.LookupEnv.
type Lookup func(string) (string, bool)

// FromMap is a Lookup over a map (for tests).
func FromMap(m map[string]string) Lookup {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

// Lookup returns the value of flag in r and whether it is set.
func (r *Result) Lookup(flag string) (Setting, bool) {
	for _, s := range r.Settings {
		if s.Flag == flag {
			return s, true
		}
	}
	return Setting{}, false
}

// translator accumulates the result and every error.
type translator struct {
	env  Lookup
	res  Result
	errs []error
}

func (t *translator) get(name string) (string, bool) {
	v, ok := t.env(name)
	return v, ok
}

// str returns the variable's value, or def when unset.
func (t *translator) str(name, def string) string {
	if v, ok := t.get(name); ok {
		return v
	}
	return def
}

func (t *translator) boolean(name string, def bool) bool {
	v, ok := t.get(name)
	if !ok || v == "" {
		return def
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		t.errs = append(t.errs, fmt.Errorf("%s=%q: want true or false", name, v))
		return def
	}
	return b
}

func (t *translator) integer(name string, def int) int {
	v, ok := t.get(name)
	if !ok || v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		t.errs = append(t.errs, fmt.Errorf("%s=%q: want an integer", name, v))
		return def
	}
	return n
}

func (t *translator) float(name string, def float64) float64 {
	v, ok := t.get(name)
	if !ok || v == "" {
		return def
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		t.errs = append(t.errs, fmt.Errorf("%s=%q: want a number", name, v))
		return def
	}
	return f
}

func (t *translator) duration(name string, def time.Duration) (time.Duration, bool) {
	v, ok := t.get(name)
	if !ok || v == "" {
		return def, false
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		t.errs = append(t.errs, fmt.Errorf("%s=%q: want a duration like 10s", name, v))
		return def, false
	}
	return d, true
}

// set records a flag value; from names the variables, which count as
// "reference default" when none of them is set.
func (t *translator) set(flag, value string, from ...string) {
	src := "reference default"
	var named []string
	for _, f := range from {
		if _, ok := t.get(f); ok {
			named = append(named, f)
		}
	}
	if len(named) > 0 {
		src = strings.Join(named, ", ")
	}
	for i := range t.res.Settings {
		if t.res.Settings[i].Flag == flag {
			t.res.Settings[i] = Setting{Flag: flag, Value: value, From: src}
			return
		}
	}
	t.res.Settings = append(t.res.Settings, Setting{Flag: flag, Value: value, From: src})
}

// isSet reports a variable that is set (even to "").
func (t *translator) isSet(name string) bool {
	_, ok := t.get(name)
	return ok
}

func (t *translator) unsupported(name, value, why string) {
	t.errs = append(t.errs, fmt.Errorf("%s=%s is not supported by envoy-rls: %s", name, value, why))
}

func (t *translator) ignore(name, reason string) {
	if t.isSet(name) {
		t.res.Ignored = append(t.res.Ignored, Ignored{Var: name, Reason: reason})
	}
}

// Translate reads the reference's variables through env.
func Translate(env Lookup) (*Result, error) {
	t := &translator{env: env}
	t.listeners()
	t.grpcTLS()
	t.logging()
	t.configSource()
	t.stats()
	t.backend()
	t.modes()
	t.ignored()
	sort.Slice(t.res.Ignored, func(i, j int) bool { return t.res.Ignored[i].Var < t.res.Ignored[j].Var })
	return &t.res, errors.Join(t.errs...)
}

func (t *translator) listeners() {
	addr := func(hostVar, hostDef, portVar string, portDef int) string {
		port := t.integer(portVar, portDef)
		if port < 0 || port > 65535 {
			t.errs = append(t.errs, fmt.Errorf("%s=%d: want a port from 0 to 65535", portVar, port))
		}
		return net.JoinHostPort(t.str(hostVar, hostDef), strconv.Itoa(port))
	}
	t.set("http-addr", addr("HOST", "0.0.0.0", "PORT", 8080), "HOST", "PORT")
	t.set("debug-addr", addr("DEBUG_HOST", "0.0.0.0", "DEBUG_PORT", 6070), "DEBUG_HOST", "DEBUG_PORT")
	if uds := t.str("GRPC_UDS", ""); uds != "" {
		t.set("grpc-addr", "unix:"+uds, "GRPC_UDS")
	} else {
		t.set("grpc-addr", addr("GRPC_HOST", "0.0.0.0", "GRPC_PORT", 8081), "GRPC_HOST", "GRPC_PORT")
	}
	if d, ok := t.duration("GRPC_MAX_CONNECTION_AGE", 24*time.Hour); ok {
		t.set("grpc-max-connection-age", d.String(), "GRPC_MAX_CONNECTION_AGE")
	}
	if d, ok := t.duration("GRPC_MAX_CONNECTION_AGE_GRACE", time.Hour); ok {
		t.set("grpc-max-connection-age-grace", d.String(), "GRPC_MAX_CONNECTION_AGE_GRACE")
	}
}

func (t *translator) grpcTLS() {
	if !t.boolean("GRPC_SERVER_USE_TLS", false) {
		for _, v := range []string{"GRPC_SERVER_TLS_CERT", "GRPC_SERVER_TLS_KEY", "GRPC_CLIENT_TLS_CACERT", "GRPC_SERVER_TLS_CA_CERT", "GRPC_CLIENT_TLS_SAN"} {
			t.ignore(v, "GRPC_SERVER_USE_TLS is not true")
		}
		return
	}
	cert, key := t.str("GRPC_SERVER_TLS_CERT", ""), t.str("GRPC_SERVER_TLS_KEY", "")
	if cert == "" || key == "" {
		t.errs = append(t.errs, errors.New("GRPC_SERVER_USE_TLS=true needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY"))
	}
	t.set("grpc-tls-cert", cert, "GRPC_SERVER_TLS_CERT")
	t.set("grpc-tls-key", key, "GRPC_SERVER_TLS_KEY")
	// The reference reads GRPC_CLIENT_TLS_CACERT; Envoy Gateway sets
	// GRPC_SERVER_TLS_CA_CERT. Either asks for client certificates.
	if ca := t.str("GRPC_CLIENT_TLS_CACERT", ""); ca != "" {
		t.set("grpc-tls-client-ca", ca, "GRPC_CLIENT_TLS_CACERT")
		t.ignore("GRPC_SERVER_TLS_CA_CERT", "GRPC_CLIENT_TLS_CACERT is set and wins")
	} else if ca := t.str("GRPC_SERVER_TLS_CA_CERT", ""); ca != "" {
		t.set("grpc-tls-client-ca", ca, "GRPC_SERVER_TLS_CA_CERT")
	}
	if san := t.str("GRPC_CLIENT_TLS_SAN", ""); san != "" {
		t.set("grpc-tls-client-san", san, "GRPC_CLIENT_TLS_SAN")
	}
}

func (t *translator) logging() {
	level := strings.ToLower(t.str("LOG_LEVEL", "warn"))
	switch level {
	case "trace", "debug":
		level = "debug"
	case "info":
	case "warn", "warning":
		level = "warn"
	case "error", "fatal", "panic":
		level = "error"
	default:
		t.errs = append(t.errs, fmt.Errorf("LOG_LEVEL=%q: want trace, debug, info, warn, error, fatal or panic", t.str("LOG_LEVEL", "")))
	}
	t.set("log-level", level, "LOG_LEVEL")
	switch f := strings.ToLower(t.str("LOG_FORMAT", "text")); f {
	case "text", "json":
		t.set("log-format", f, "LOG_FORMAT")
	default:
		t.errs = append(t.errs, fmt.Errorf("LOG_FORMAT=%q: want text or json", t.str("LOG_FORMAT", "")))
	}
}

// RuntimeDir is the config directory of the reference's file provider:
// RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY.
func (t *translator) runtimeDir() string {
	root := t.str("RUNTIME_ROOT", "/srv/runtime_data/current")
	parts := []string{root}
	if sub := t.str("RUNTIME_SUBDIRECTORY", ""); sub != "" {
		parts = append(parts, sub)
	}
	parts = append(parts, t.str("RUNTIME_APPDIRECTORY", "config"))
	return strings.TrimRight(strings.Join(parts, "/"), "/")
}

func (t *translator) configSource() {
	ctype := strings.ToUpper(t.str("CONFIG_TYPE", "FILE"))
	t.boolean("RUNTIME_IGNOREDOTFILES", false) // checked; dotfiles are always skipped
	t.ignore("RUNTIME_IGNOREDOTFILES", "dotfiles in the config directory are always skipped")
	if t.boolean("MERGE_DOMAIN_CONFIG", false) {
		t.unsupported("MERGE_DOMAIN_CONFIG", "true", "a domain must be defined in one file (or one xDS resource)")
	}
	if t.boolean("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", false) {
		t.set("health-requires-config", "true", "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED")
	}
	xdsVars := []string{"CONFIG_GRPC_XDS_NODE_ID", "CONFIG_GRPC_XDS_NODE_METADATA", "CONFIG_GRPC_XDS_SERVER_URL",
		"CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
		"CONFIG_GRPC_XDS_SERVER_USE_TLS", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
		"CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "CONFIG_GRPC_XDS_SERVER_TLS_SAN", "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL",
		"XDS_CLIENT_BACKOFF_MAX_INTERVAL", "XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "XDS_CLIENT_BACKOFF_JITTER",
		"XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "FORCE_START_WITHOUT_INITIAL_CONFIG"}
	runtimeVars := []string{"RUNTIME_ROOT", "RUNTIME_SUBDIRECTORY", "RUNTIME_APPDIRECTORY", "RUNTIME_WATCH_ROOT"}
	switch ctype {
	case "FILE":
		for _, v := range xdsVars {
			t.ignore(v, "CONFIG_TYPE is FILE")
		}
		t.set("config", t.runtimeDir(), "RUNTIME_ROOT", "RUNTIME_SUBDIRECTORY", "RUNTIME_APPDIRECTORY")
		if t.boolean("RUNTIME_WATCH_ROOT", true) {
			// The reference then reloads when RUNTIME_ROOT itself is
			// swapped (a symlink replaced by another).
			t.set("watch-root", t.str("RUNTIME_ROOT", "/srv/runtime_data/current"), "RUNTIME_WATCH_ROOT", "RUNTIME_ROOT")
		}
	case "GRPC_XDS_SOTW":
		for _, v := range runtimeVars {
			t.ignore(v, "CONFIG_TYPE is GRPC_XDS_SOTW")
		}
		t.xds()
	default:
		t.errs = append(t.errs, fmt.Errorf("CONFIG_TYPE=%q: want FILE or GRPC_XDS_SOTW", t.str("CONFIG_TYPE", "")))
	}
}

func (t *translator) xds() {
	t.set("config-xds", t.str("CONFIG_GRPC_XDS_SERVER_URL", "localhost:18000"), "CONFIG_TYPE", "CONFIG_GRPC_XDS_SERVER_URL")
	t.set("xds-node-id", t.str("CONFIG_GRPC_XDS_NODE_ID", "default"), "CONFIG_GRPC_XDS_NODE_ID")
	if m := t.str("CONFIG_GRPC_XDS_NODE_METADATA", ""); m != "" {
		t.set("xds-node-metadata", m, "CONFIG_GRPC_XDS_NODE_METADATA")
	}
	if h := t.str("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", ""); h != "" {
		if _, err := ParseHeaders(h); err != nil {
			t.errs = append(t.errs, fmt.Errorf("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS: %v", err))
		}
		t.set("xds-headers", h, "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS")
	}
	if t.boolean("CONFIG_GRPC_XDS_SERVER_USE_TLS", false) {
		t.set("xds-tls", "true", "CONFIG_GRPC_XDS_SERVER_USE_TLS")
		for _, m := range []struct{ v, flag string }{
			{"CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "xds-tls-cert"},
			{"CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "xds-tls-key"},
			{"CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "xds-tls-ca"},
			{"CONFIG_GRPC_XDS_SERVER_TLS_SAN", "xds-tls-server-name"},
		} {
			if s := t.str(m.v, ""); s != "" {
				t.set(m.flag, s, m.v)
			}
		}
	} else {
		for _, v := range []string{"CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "CONFIG_GRPC_XDS_SERVER_TLS_SAN"} {
			t.ignore(v, "CONFIG_GRPC_XDS_SERVER_USE_TLS is not true")
		}
	}
	d, _ := t.duration("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", 10*time.Second)
	t.set("xds-backoff-initial", d.String(), "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL")
	d, _ = t.duration("XDS_CLIENT_BACKOFF_MAX_INTERVAL", 60*time.Second)
	t.set("xds-backoff-max", d.String(), "XDS_CLIENT_BACKOFF_MAX_INTERVAL")
	f := t.float("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", 0.5)
	if f < 0 || f > 1 {
		t.errs = append(t.errs, fmt.Errorf("XDS_CLIENT_BACKOFF_RANDOM_FACTOR=%v: want a number from 0 to 1", f))
	}
	t.set("xds-backoff-random-factor", strconv.FormatFloat(f, 'g', -1, 64), "XDS_CLIENT_BACKOFF_RANDOM_FACTOR")
	t.set("xds-backoff-jitter", strconv.FormatBool(t.boolean("XDS_CLIENT_BACKOFF_JITTER", true)), "XDS_CLIENT_BACKOFF_JITTER")
	if n := t.integer("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", 0); n > 0 {
		t.set("xds-max-message-size", strconv.Itoa(n), "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES")
	}
	if t.boolean("FORCE_START_WITHOUT_INITIAL_CONFIG", false) {
		t.set("force-start-without-initial-config", "true", "FORCE_START_WITHOUT_INITIAL_CONFIG")
	}
	if _, err := time.ParseDuration(t.str("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "3s")); err != nil {
		t.errs = append(t.errs, fmt.Errorf("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL=%q: want a duration like 3s", t.str("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "")))
	}
	t.ignore("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "reconnects follow XDS_CLIENT_BACKOFF_*")
}

// ParseHeaders reads the reference's header list "k1:v1,k2:v2".
func ParseHeaders(s string) (map[string]string, error) {
	out := map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		if kv = strings.TrimSpace(kv); kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, ":")
		if !ok || k == "" {
			return nil, fmt.Errorf("%q: want key:value pairs separated by commas", kv)
		}
		out[strings.ToLower(k)] = v
	}
	return out, nil
}

// ParseNodeMetadata reads the reference's node metadata "k1=v1,k2=v2"
// (string values); items without '=' are skipped, as the reference does.
func ParseNodeMetadata(s string) map[string]string {
	out := map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			out[k] = v
		}
	}
	return out
}

func (t *translator) stats() {
	if t.boolean("USE_STATSD", true) && t.isSet("USE_STATSD") {
		t.unsupported("USE_STATSD", "true", "envoy-rls exports Prometheus metrics only (USE_PROMETHEUS=true, or /metrics on the HTTP port)")
	}
	if t.boolean("USE_DOG_STATSD", false) {
		t.unsupported("USE_DOG_STATSD", "true", "envoy-rls exports Prometheus metrics only")
	}
	if t.boolean("USE_PROMETHEUS", false) {
		t.set("metrics-addr", t.str("PROMETHEUS_ADDR", ":9090"), "USE_PROMETHEUS", "PROMETHEUS_ADDR")
		t.set("metrics-path", t.str("PROMETHEUS_PATH", "/metrics"), "USE_PROMETHEUS", "PROMETHEUS_PATH")
		t.set("reference-metrics", "true", "USE_PROMETHEUS")
		t.ignore("PROMETHEUS_MAPPER_YAML", "the ratelimit_service_* series are exported under Envoy Gateway's mapped names directly")
		t.ignore("PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", "response time is exported in seconds")
	} else {
		for _, v := range []string{"PROMETHEUS_ADDR", "PROMETHEUS_PATH", "PROMETHEUS_MAPPER_YAML", "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS"} {
			t.ignore(v, "USE_PROMETHEUS is not true")
		}
	}
	if r := t.float("NEAR_LIMIT_RATIO", 0.8); r < 0 || r > 1 {
		t.errs = append(t.errs, fmt.Errorf("NEAR_LIMIT_RATIO=%v: want a number from 0 to 1", r))
	} else if t.isSet("NEAR_LIMIT_RATIO") {
		t.set("near-limit-ratio", strconv.FormatFloat(r, 'g', -1, 64), "NEAR_LIMIT_RATIO")
	}
}

func (t *translator) backend() {
	switch b := strings.ToLower(t.str("BACKEND_TYPE", "redis")); b {
	case "redis":
	case "memcache":
		t.unsupported("BACKEND_TYPE", "memcache", "the backends are redis and the embedded memory store (--backend memory)")
		return
	default:
		t.errs = append(t.errs, fmt.Errorf("BACKEND_TYPE=%q: want redis", t.str("BACKEND_TYPE", "")))
		return
	}
	t.set("backend", "redis", "BACKEND_TYPE")
	if t.boolean("REDIS_PERSECOND", false) {
		t.unsupported("REDIS_PERSECOND", "true", "one Redis (or Sentinel, or Cluster) holds every counter")
	}
	tlsOn := t.boolean("REDIS_TLS", false)
	scheme := "redis"
	if tlsOn {
		scheme = "rediss"
	}
	var user *url.Userinfo
	if auth := t.str("REDIS_AUTH", ""); auth != "" {
		if u, p, ok := strings.Cut(auth, ":"); ok {
			user = url.UserPassword(u, p)
		} else {
			user = url.UserPassword("", auth)
		}
	}
	rawURL := t.str("REDIS_URL", "/var/run/nutcracker/ratelimit.sock")
	socket := strings.ToLower(t.str("REDIS_SOCKET_TYPE", "unix"))
	if socket != "unix" && socket != "tcp" {
		t.errs = append(t.errs, fmt.Errorf("REDIS_SOCKET_TYPE=%q: want tcp or unix", t.str("REDIS_SOCKET_TYPE", "")))
		return
	}
	redisURL := func(host string) string {
		u := url.URL{Scheme: scheme, Host: host, User: user}
		return u.String()
	}
	urlVars := []string{"REDIS_URL", "REDIS_SOCKET_TYPE", "REDIS_AUTH", "REDIS_TLS"}
	switch typ := strings.ToUpper(t.str("REDIS_TYPE", "SINGLE")); typ {
	case "SINGLE":
		t.ignore("REDIS_SENTINEL_AUTH", "REDIS_TYPE is not SENTINEL")
		if socket == "unix" {
			if tlsOn {
				t.unsupported("REDIS_TLS", "true", "TLS over a unix socket")
			}
			u := url.URL{Scheme: "unix", Path: rawURL, User: user}
			t.set("redis-url", u.String(), urlVars...)
			break
		}
		if strings.Contains(rawURL, ",") {
			t.errs = append(t.errs, fmt.Errorf("REDIS_URL=%q: a list needs REDIS_TYPE=SENTINEL or CLUSTER", rawURL))
			return
		}
		t.set("redis-url", redisURL(rawURL), urlVars...)
	case "SENTINEL":
		parts := strings.Split(rawURL, ",")
		if len(parts) < 2 || parts[0] == "" {
			t.errs = append(t.errs, fmt.Errorf("REDIS_URL=%q: REDIS_TYPE=SENTINEL wants master,host:port[,host:port...]", rawURL))
			return
		}
		t.set("redis-sentinel-master", parts[0], "REDIS_URL")
		t.set("redis-sentinel", strings.Join(parts[1:], ","), "REDIS_URL")
		if user != nil || tlsOn {
			t.set("redis-url", redisURL(parts[1]), urlVars...)
		}
		if a := t.str("REDIS_SENTINEL_AUTH", ""); a != "" {
			t.set("redis-sentinel-password", a, "REDIS_SENTINEL_AUTH")
		}
	case "CLUSTER":
		t.ignore("REDIS_SENTINEL_AUTH", "REDIS_TYPE is not SENTINEL")
		t.set("redis-cluster", rawURL, "REDIS_URL")
		if user != nil || tlsOn {
			t.set("redis-url", redisURL(strings.Split(rawURL, ",")[0]), urlVars...)
		}
	default:
		t.errs = append(t.errs, fmt.Errorf("REDIS_TYPE=%q: want SINGLE, SENTINEL or CLUSTER", t.str("REDIS_TYPE", "")))
	}
	if tlsOn {
		for _, m := range []struct{ v, flag string }{
			{"REDIS_TLS_CLIENT_CERT", "redis-tls-cert-file"},
			{"REDIS_TLS_CLIENT_KEY", "redis-tls-key-file"},
			{"REDIS_TLS_CACERT", "redis-tls-ca-file"},
		} {
			if s := t.str(m.v, ""); s != "" {
				t.set(m.flag, s, m.v)
			}
		}
		if t.boolean("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", false) {
			t.set("redis-tls-insecure-skip-verify", "true", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION")
		}
	} else {
		for _, v := range []string{"REDIS_TLS_CLIENT_CERT", "REDIS_TLS_CLIENT_KEY", "REDIS_TLS_CACERT", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION"} {
			t.ignore(v, "REDIS_TLS is not true")
		}
	}
	if n := t.integer("REDIS_POOL_SIZE", 10); n < 1 {
		t.errs = append(t.errs, fmt.Errorf("REDIS_POOL_SIZE=%d: want at least 1", n))
	} else {
		t.set("redis-pool-size", strconv.Itoa(n), "REDIS_POOL_SIZE")
	}
	if d, _ := t.duration("REDIS_TIMEOUT", 10*time.Second); d > 0 {
		for _, f := range []string{"redis-dial-timeout", "redis-read-timeout", "redis-write-timeout"} {
			t.set(f, d.String(), "REDIS_TIMEOUT")
		}
	}
	if d, ok := t.duration("REDIS_PIPELINE_WINDOW", 0); ok {
		t.set("redis-batch-window", d.String(), "REDIS_PIPELINE_WINDOW")
	}
	if n := t.integer("REDIS_PIPELINE_LIMIT", 0); n > 0 {
		t.set("redis-batch-size", strconv.Itoa(n), "REDIS_PIPELINE_LIMIT")
	}
	if p := t.str("CACHE_KEY_PREFIX", ""); p != "" {
		t.set("key-prefix", p, "CACHE_KEY_PREFIX")
	}
	if t.isSet("LOCAL_CACHE_SIZE_IN_BYTES") {
		t.set("local-deny-cache", strconv.FormatBool(t.integer("LOCAL_CACHE_SIZE_IN_BYTES", 0) > 0), "LOCAL_CACHE_SIZE_IN_BYTES")
	}
}

func (t *translator) modes() {
	for _, m := range []struct{ v, flag string }{
		{"SHADOW_MODE", "shadow-mode"},
		{"QUOTA_MODE", "quota-mode"},
		{"RESPONSE_DYNAMIC_METADATA", "response-dynamic-metadata"},
		{"LIMIT_RESPONSE_HEADERS_ENABLED", "response-headers"},
	} {
		if t.boolean(m.v, false) {
			t.set(m.flag, "true", m.v)
		}
	}
	for _, h := range []struct{ v, def string }{
		{"LIMIT_LIMIT_HEADER", "RateLimit-Limit"},
		{"LIMIT_REMAINING_HEADER", "RateLimit-Remaining"},
		{"LIMIT_RESET_HEADER", "RateLimit-Reset"},
	} {
		if v, ok := t.get(h.v); ok && !strings.EqualFold(v, h.def) {
			t.unsupported(h.v, v, "the header is always named "+h.def)
		}
	}
}

// ignored lists the variables with no meaning for envoy-rls.
func (t *translator) ignored() {
	for _, v := range noMeaning {
		t.ignore(v.name, v.reason)
	}
	if strings.ToLower(t.str("BACKEND_TYPE", "redis")) != "memcache" {
		for _, v := range memcacheVars {
			t.ignore(v, "BACKEND_TYPE is not memcache")
		}
	}
	if !t.boolean("REDIS_PERSECOND", false) {
		for _, v := range perSecondVars {
			t.ignore(v, "REDIS_PERSECOND is not true")
		}
	}
}

var noMeaning = []struct{ name, reason string }{
	{"STATSD_HOST", "no statsd"},
	{"STATSD_PORT", "no statsd"},
	{"USE_DOG_STATSD_MOGRIFIERS", "no statsd"},
	{"EXTRA_TAGS", "no statsd"},
	{"STATS_FLUSH_INTERVAL", "Prometheus metrics are read when scraped"},
	{"DISABLE_STATS", "metrics cost nothing until scraped"},
	{"EXPIRATION_JITTER_MAX_SECONDS", "keys expire exactly when their state is fresh again"},
	{"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "a denied request never charges any counter"},
	{"REDIS_CLUSTER_PIPELINE_PARALLELISM", "pipelines are per connection (see --redis-batch-size)"},
	{"REDIS_POOL_ON_EMPTY_BEHAVIOR", "calls wait for a connection within their deadline"},
	{"REDIS_STARTUP_INITIAL_INTERVAL", "the service starts while Redis is down and reconnects by itself"},
	{"REDIS_STARTUP_MAX_INTERVAL", "the service starts while Redis is down and reconnects by itself"},
	{"REDIS_STARTUP_MAX_ELAPSED_TIME", "the service starts while Redis is down and reconnects by itself"},
	{"REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "Redis outages after start-up are handled by --failure-mode"},
}

var memcacheVars = []string{"MEMCACHE_HOST_PORT", "MEMCACHE_SRV", "MEMCACHE_SRV_REFRESH", "MEMCACHE_MAX_IDLE_CONNS",
	"MEMCACHE_TLS", "MEMCACHE_TLS_CLIENT_CERT", "MEMCACHE_TLS_CLIENT_KEY", "MEMCACHE_TLS_CACERT", "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION"}

var perSecondVars = []string{"REDIS_PERSECOND_SOCKET_TYPE", "REDIS_PERSECOND_TYPE", "REDIS_PERSECOND_URL", "REDIS_PERSECOND_POOL_SIZE",
	"REDIS_PERSECOND_AUTH", "REDIS_PERSECOND_SENTINEL_AUTH", "REDIS_PERSECOND_TLS", "REDIS_PERSECOND_PIPELINE_WINDOW",
	"REDIS_PERSECOND_PIPELINE_LIMIT", "REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM", "REDIS_PERSECOND_TIMEOUT",
	"REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR"}

// HandledElsewhere are reference variables read directly by other parts of
// envoy-rls (tracing).
var HandledElsewhere = []string{"TRACING_ENABLED", "TRACING_SERVICE_NAME", "TRACING_SERVICE_NAMESPACE",
	"TRACING_SERVICE_INSTANCE_ID", "TRACING_EXPORTER_PROTOCOL", "TRACING_SAMPLING_RATE"}
