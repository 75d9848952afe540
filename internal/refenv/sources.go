package refenv

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/envoyrls/envoy-rls/pkg/xdsconfig"
)

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
	// Unset, the native defaults stand (the reference's: 24h and 1h).
	if d, ok := t.duration("GRPC_MAX_CONNECTION_AGE", 0); ok {
		t.set("grpc-max-connection-age", d.String(), "GRPC_MAX_CONNECTION_AGE")
	}
	if d, ok := t.duration("GRPC_MAX_CONNECTION_AGE_GRACE", 0); ok {
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
	// Every config the reference accepts loads, with its meaning (and a
	// warning for what the native format refuses).
	t.set("config-lenient", "true", "CONFIG_TYPE")
	if t.boolean("MERGE_DOMAIN_CONFIG", false) {
		t.set("merge-domain-config", "true", "MERGE_DOMAIN_CONFIG")
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
	runtimeVars := []string{"RUNTIME_ROOT", "RUNTIME_SUBDIRECTORY", "RUNTIME_APPDIRECTORY", "RUNTIME_WATCH_ROOT", "RUNTIME_IGNOREDOTFILES"}
	switch ctype {
	case "FILE":
		for _, v := range xdsVars {
			t.ignore(v, "CONFIG_TYPE is FILE")
		}
		t.set("config", t.runtimeDir(), "RUNTIME_ROOT", "RUNTIME_SUBDIRECTORY", "RUNTIME_APPDIRECTORY")
		// The reference's runtime loader reads every file below the
		// directory, whatever its name, dotfiles unless
		// RUNTIME_IGNOREDOTFILES; and it starts when the files do not
		// load (calls fail until a valid config is loaded).
		t.set("config-recursive", "true", "CONFIG_TYPE")
		t.set("config-all-files", "true", "CONFIG_TYPE")
		if !t.boolean("RUNTIME_IGNOREDOTFILES", false) {
			t.set("config-dotfiles", "true", "RUNTIME_IGNOREDOTFILES")
		}
		t.set("force-start-without-initial-config", "true", "CONFIG_TYPE")
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
	// The native backoff is the reference's.
	def := xdsconfig.DefaultBackoff
	d, _ := t.duration("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", def.Initial)
	t.set("xds-backoff-initial", d.String(), "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL")
	d, _ = t.duration("XDS_CLIENT_BACKOFF_MAX_INTERVAL", def.Max)
	t.set("xds-backoff-max", d.String(), "XDS_CLIENT_BACKOFF_MAX_INTERVAL")
	f := t.float("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", def.RandomFactor)
	if f < 0 || f > 1 {
		t.errs = append(t.errs, fmt.Errorf("XDS_CLIENT_BACKOFF_RANDOM_FACTOR=%v: want a number from 0 to 1", f))
	}
	t.set("xds-backoff-random-factor", strconv.FormatFloat(f, 'g', -1, 64), "XDS_CLIENT_BACKOFF_RANDOM_FACTOR")
	t.set("xds-backoff-jitter", strconv.FormatBool(t.boolean("XDS_CLIENT_BACKOFF_JITTER", def.Jitter)), "XDS_CLIENT_BACKOFF_JITTER")
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
