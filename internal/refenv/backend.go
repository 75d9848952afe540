package refenv

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/envoyrls/envoy-rls/pkg/rlheaders"
	"github.com/envoyrls/envoy-rls/pkg/rls"
)

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
	if r := t.float("NEAR_LIMIT_RATIO", rls.DefaultNearLimitRatio); r < 0 || r > 1 {
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
	tlsOn := t.redis(mainRedis)
	// REDIS_PERSECOND: a second Redis for the counters of SECOND limits,
	// configured by the same variables with REDIS_PERSECOND_ (the TLS
	// files are shared, as in the reference).
	if t.boolean("REDIS_PERSECOND", false) {
		tlsOn = t.redis(perSecondRedis) || tlsOn
	}
	if !tlsOn {
		for _, v := range []string{"REDIS_TLS_CLIENT_CERT", "REDIS_TLS_CLIENT_KEY", "REDIS_TLS_CACERT", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION"} {
			t.ignore(v, "REDIS_TLS is not true")
		}
	}
	if p := t.str("CACHE_KEY_PREFIX", ""); p != "" {
		t.set("key-prefix", p, "CACHE_KEY_PREFIX")
	}
	if t.isSet("LOCAL_CACHE_SIZE_IN_BYTES") {
		t.set("local-deny-cache", strconv.FormatBool(t.integer("LOCAL_CACHE_SIZE_IN_BYTES", 0) > 0), "LOCAL_CACHE_SIZE_IN_BYTES")
	}
}

// redisVars names the variables of one Redis (the reference's REDIS_* or
// REDIS_PERSECOND_*) and the flags they map to (--redis-* or
// --redis-persecond-*).
type redisVars struct {
	v, flag, defaultURL string
	on                  string // the variable that turns it on, if any
}

var (
	mainRedis      = redisVars{"REDIS_", "redis-", "/var/run/nutcracker/ratelimit.sock", ""}
	perSecondRedis = redisVars{"REDIS_PERSECOND_", "redis-persecond-", "/var/run/nutcracker/ratelimitpersecond.sock", "REDIS_PERSECOND"}
)

// redis maps one Redis's variables to its flags and reports whether its
// TLS is on.
func (t *translator) redis(r redisVars) (tlsOn bool) {
	tlsOn = t.boolean(r.v+"TLS", false)
	scheme := "redis"
	if tlsOn {
		scheme = "rediss"
	}
	var user *url.Userinfo
	if auth := t.str(r.v+"AUTH", ""); auth != "" {
		if u, p, ok := strings.Cut(auth, ":"); ok {
			user = url.UserPassword(u, p)
		} else {
			user = url.UserPassword("", auth)
		}
	}
	rawURL := t.str(r.v+"URL", r.defaultURL)
	socket := strings.ToLower(t.str(r.v+"SOCKET_TYPE", "unix"))
	if socket != "unix" && socket != "tcp" {
		t.errs = append(t.errs, fmt.Errorf("%sSOCKET_TYPE=%q: want tcp or unix", r.v, t.str(r.v+"SOCKET_TYPE", "")))
		return tlsOn
	}
	redisURL := func(host string) string {
		u := url.URL{Scheme: scheme, Host: host, User: user}
		return u.String()
	}
	urlVars := []string{r.v + "URL", r.v + "SOCKET_TYPE", r.v + "AUTH", r.v + "TLS"}
	if r.on != "" {
		urlVars = append(urlVars, r.on)
	}
	switch typ := strings.ToUpper(t.str(r.v+"TYPE", "SINGLE")); typ {
	case "SINGLE":
		t.ignore(r.v+"SENTINEL_AUTH", r.v+"TYPE is not SENTINEL")
		if socket == "unix" {
			if looksLikeHostPort(rawURL) {
				how := "its default"
				if t.isSet(r.v + "SOCKET_TYPE") {
					how = "set so"
				}
				t.errs = append(t.errs, fmt.Errorf("%sURL=%q is a host:port, but %sSOCKET_TYPE is unix (%s), which wants a socket path: set %sSOCKET_TYPE=tcp",
					r.v, rawURL, r.v, how, r.v))
			} else if tlsOn {
				t.unsupported(r.v+"TLS", "true", "TLS over a unix socket")
			}
			// Set even on error: Selectors names the flag of each variable.
			u := url.URL{Scheme: "unix", Path: rawURL, User: user}
			t.set(r.flag+"url", u.String(), urlVars...)
			break
		}
		if strings.Contains(rawURL, ",") {
			t.errs = append(t.errs, fmt.Errorf("%sURL=%q: a list needs %sTYPE=SENTINEL or CLUSTER", r.v, rawURL, r.v))
			return tlsOn
		}
		t.set(r.flag+"url", redisURL(rawURL), urlVars...)
	case "SENTINEL":
		parts := strings.Split(rawURL, ",")
		if len(parts) < 2 || parts[0] == "" {
			t.errs = append(t.errs, fmt.Errorf("%sURL=%q: %sTYPE=SENTINEL wants master,host:port[,host:port...]", r.v, rawURL, r.v))
			return tlsOn
		}
		t.set(r.flag+"sentinel-master", parts[0], r.v+"URL")
		t.set(r.flag+"sentinel", strings.Join(parts[1:], ","), r.v+"URL")
		if user != nil || tlsOn {
			t.set(r.flag+"url", redisURL(parts[1]), urlVars...)
		}
		if a := t.str(r.v+"SENTINEL_AUTH", ""); a != "" {
			t.set(r.flag+"sentinel-password", a, r.v+"SENTINEL_AUTH")
		}
	case "CLUSTER":
		t.ignore(r.v+"SENTINEL_AUTH", r.v+"TYPE is not SENTINEL")
		t.set(r.flag+"cluster", rawURL, r.v+"URL")
		if user != nil || tlsOn {
			t.set(r.flag+"url", redisURL(strings.Split(rawURL, ",")[0]), urlVars...)
		}
	default:
		t.errs = append(t.errs, fmt.Errorf("%sTYPE=%q: want SINGLE, SENTINEL or CLUSTER", r.v, t.str(r.v+"TYPE", "")))
	}
	if tlsOn {
		// The TLS files are REDIS_TLS_*, whichever Redis uses them.
		for _, m := range []struct{ v, flag string }{
			{"REDIS_TLS_CLIENT_CERT", "tls-cert-file"},
			{"REDIS_TLS_CLIENT_KEY", "tls-key-file"},
			{"REDIS_TLS_CACERT", "tls-ca-file"},
		} {
			if s := t.str(m.v, ""); s != "" {
				t.set(r.flag+m.flag, s, m.v)
			}
		}
		if t.boolean("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", false) {
			t.set(r.flag+"tls-insecure-skip-verify", "true", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION")
		}
	}
	if n := t.integer(r.v+"POOL_SIZE", 10); n < 1 {
		t.errs = append(t.errs, fmt.Errorf("%sPOOL_SIZE=%d: want at least 1", r.v, n))
	} else {
		t.set(r.flag+"pool-size", strconv.Itoa(n), r.v+"POOL_SIZE")
	}
	if d, _ := t.duration(r.v+"TIMEOUT", 10*time.Second); d > 0 {
		for _, f := range []string{"dial-timeout", "read-timeout", "write-timeout"} {
			t.set(r.flag+f, d.String(), r.v+"TIMEOUT")
		}
	}
	if d, ok := t.duration(r.v+"PIPELINE_WINDOW", 0); ok {
		t.set(r.flag+"batch-window", d.String(), r.v+"PIPELINE_WINDOW")
	}
	if n := t.integer(r.v+"PIPELINE_LIMIT", 0); n > 0 {
		t.set(r.flag+"batch-size", strconv.Itoa(n), r.v+"PIPELINE_LIMIT")
	}
	return tlsOn
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
	for _, h := range []struct{ v, flag string }{
		{"LIMIT_LIMIT_HEADER", "response-headers-limit-name"},
		{"LIMIT_REMAINING_HEADER", "response-headers-remaining-name"},
		{"LIMIT_RESET_HEADER", "response-headers-reset-name"},
	} {
		v, ok := t.get(h.v)
		switch {
		case !ok:
		case !rlheaders.ValidFieldName(v):
			t.errs = append(t.errs, fmt.Errorf("%s=%q: want an HTTP header name (letters, digits and !#$%%&'*+-.^_`|~)", h.v, v))
		default:
			t.set(h.flag, v, h.v)
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
	} else {
		t.ignore("REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM", "pipelines are per connection (see --redis-persecond-batch-size)")
		t.ignore("REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR", "calls wait for a connection within their deadline")
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

// handledElsewhere are reference variables read directly by other parts of
// envoy-rls (tracing).
var handledElsewhere = []string{"TRACING_ENABLED", "TRACING_SERVICE_NAME", "TRACING_SERVICE_NAMESPACE",
	"TRACING_SERVICE_INSTANCE_ID", "TRACING_EXPORTER_PROTOCOL", "TRACING_SAMPLING_RATE"}

// looksLikeHostPort reports a Redis address given as host:port (no path
// separator, a numeric port), which a unix socket path is not.
func looksLikeHostPort(s string) bool {
	if strings.Contains(s, "/") {
		return false
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil || host == "" {
		return false
	}
	n, err := strconv.Atoi(port)
	return err == nil && n > 0 && n <= 65535
}
