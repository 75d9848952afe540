package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/envoyrls/envoy-rls/internal/debugsrv"
	"github.com/envoyrls/envoy-rls/pkg/rls"
)

// listenerOptions are the listeners' addresses, what one client can hold
// on them, and how long shutdown waits for the calls in flight.
type listenerOptions struct {
	GRPCAddr      string
	HTTPAddr      string
	DebugAddr     string
	MetricsAddr   string
	MetricsPath   string
	ShutdownGrace time.Duration

	GRPCMaxConcurrentStreams  int
	GRPCStreamWorkers         int
	GRPCMaxRecvMsgSize        byteSize
	GRPCMaxConnectionAge      time.Duration
	GRPCMaxConnectionAgeGrace time.Duration
	GRPCMaxConnections        int
	GRPCMaxConnectionIdle     time.Duration
	FirstRequestTimeout       time.Duration
	HTTPReadHeaderTimeout     time.Duration
	HTTPReadTimeout           time.Duration
	HTTPWriteTimeout          time.Duration
	HTTPIdleTimeout           time.Duration
	HTTPMaxConnections        int
	HTTPReservedConnections   int
}

// addFlags defines the addresses under main and the bounds of connections
// under bounds.
func (o *listenerOptions) addFlags(main, bounds *flagSet) {
	main.StringVar(&o.GRPCAddr, "grpc-addr", ":8081", "gRPC listen address (RateLimitService, health, reflection)")
	main.StringVar(&o.HTTPAddr, "http-addr", ":8080", "HTTP listen address (/healthz, /json, /metrics); empty disables it")
	main.StringVar(&o.DebugAddr, "debug-addr", "", "debug listener: /rlconfig (the loaded limits), /debug/pprof/; empty disables it")
	main.StringVar(&o.MetricsAddr, "metrics-addr", "", "a separate Prometheus listener (as the reference's PROMETHEUS_ADDR); /metrics on --http-addr stays")
	main.StringVar(&o.MetricsPath, "metrics-path", "/metrics", "path of the Prometheus metrics on --metrics-addr")
	main.DurationVar(&o.ShutdownGrace, "shutdown-grace", defaultShutdownGrace, "longest wait for requests in flight on SIGTERM")
	bounds.IntVar(&o.GRPCMaxConcurrentStreams, "grpc-max-concurrent-streams", defaultGRPCMaxConcurrentStreams, "most calls in progress on one gRPC connection; further streams are refused")
	bounds.IntVar(&o.GRPCStreamWorkers, "grpc-stream-workers", defaultGRPCStreamWorkers, "goroutines that run gRPC calls one after another, sparing each call a new goroutine and the growth of its stack; a call finding all busy gets its own goroutine (0: a goroutine per call)")
	o.GRPCMaxRecvMsgSize = defaultGRPCMaxRecvMsgSize
	bounds.TextVar(&o.GRPCMaxRecvMsgSize, "grpc-max-recv-msg-size", &o.GRPCMaxRecvMsgSize, "largest gRPC request accepted (larger ones get RESOURCE_EXHAUSTED), e.g. 64KiB; bounds request memory to about this times --grpc-max-concurrent-streams per connection")
	bounds.DurationVar(&o.GRPCMaxConnectionAge, "grpc-max-connection-age", defaultGRPCMaxConnectionAge, "close a gRPC connection gracefully after this long (the reference's GRPC_MAX_CONNECTION_AGE)")
	bounds.DurationVar(&o.GRPCMaxConnectionAgeGrace, "grpc-max-connection-age-grace", defaultGRPCMaxConnectionAgeGrace, "calls in progress may finish this long after --grpc-max-connection-age (the reference's GRPC_MAX_CONNECTION_AGE_GRACE)")
	bounds.IntVar(&o.GRPCMaxConnections, "grpc-max-connections", defaultGRPCMaxConnections, "most gRPC connections open at once; at the limit a new one evicts (GOAWAY) the oldest that never sent a call or the least recently active idle one, if silent or idle for 1s, or else is closed as soon as it is accepted")
	bounds.DurationVar(&o.GRPCMaxConnectionIdle, "grpc-max-connection-idle", defaultGRPCMaxConnectionIdle, "close a gRPC connection gracefully (GOAWAY) after it has had no call in progress for this long; Envoy reconnects at its next call")
	bounds.DurationVar(&o.FirstRequestTimeout, "first-request-timeout", defaultFirstRequestTimeout, "close (GOAWAY) a gRPC connection that has not started a call this long after it was accepted, TLS handshake included")
	bounds.DurationVar(&o.HTTPReadHeaderTimeout, "http-read-header-timeout", defaultHTTPReadHeaderTimeout, "longest time to read an HTTP request's headers (a connection that sends none is closed after it)")
	bounds.DurationVar(&o.HTTPReadTimeout, "http-read-timeout", defaultHTTPReadTimeout, "longest time to read an HTTP request, body included")
	bounds.DurationVar(&o.HTTPWriteTimeout, "http-write-timeout", 10*time.Second, "longest time to handle an HTTP request and write its response")
	bounds.DurationVar(&o.HTTPIdleTimeout, "http-idle-timeout", 60*time.Second, "close an idle HTTP keep-alive connection after this long")
	bounds.IntVar(&o.HTTPMaxConnections, "http-max-connections", defaultHTTPMaxConnections, "most connections open at once on the HTTP listener (--http-addr); at the limit a new one evicts the oldest that never completed its request headers or the least recently active idle one, if silent or idle for 1s, or else goes on the reserve (--http-reserved-connections) or is closed as soon as it is accepted")
	bounds.IntVar(&o.HTTPReservedConnections, "http-reserved-connections", defaultHTTPReservedConnections, "connections accepted beyond --http-max-connections that may only ask for /healthz, /healthcheck or /metrics (others get 503 before their body is read), so that probes answer while the port is flooded")
}

// validate checks the listeners' settings; c names where a value came
// from.
func (o listenerOptions) validate(c *command) []error {
	var errs []error
	if o.GRPCAddr == "" {
		errs = append(errs, errors.New("--grpc-addr must not be empty"))
	}
	if !strings.HasPrefix(o.MetricsPath, "/") {
		errs = append(errs, errors.New("--metrics-path must start with /"))
	}
	if o.GRPCMaxConcurrentStreams < 1 {
		errs = append(errs, errors.New("--grpc-max-concurrent-streams must be at least 1"))
	}
	if o.GRPCStreamWorkers < 0 || o.GRPCStreamWorkers > maxGRPCStreamWorkers {
		errs = append(errs, fmt.Errorf("--grpc-stream-workers must be 0 to %d", maxGRPCStreamWorkers))
	}
	if o.GRPCMaxConnections < 1 {
		errs = append(errs, errors.New("--grpc-max-connections must be at least 1"))
	}
	if o.HTTPMaxConnections < 1 {
		errs = append(errs, errors.New("--http-max-connections must be at least 1"))
	}
	if o.HTTPReservedConnections < 0 {
		errs = append(errs, errors.New("--http-reserved-connections must not be negative"))
	}
	if o.GRPCMaxRecvMsgSize < minGRPCMaxRecvMsgSize || o.GRPCMaxRecvMsgSize > maxGRPCMaxRecvMsgSize {
		errs = append(errs, fmt.Errorf("%s: want %s to %s", c.value("grpc-max-recv-msg-size", formatSize(uint64(o.GRPCMaxRecvMsgSize))), formatSize(minGRPCMaxRecvMsgSize), formatSize(maxGRPCMaxRecvMsgSize)))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"--grpc-max-connection-age", o.GRPCMaxConnectionAge},
		{"--grpc-max-connection-age-grace", o.GRPCMaxConnectionAgeGrace},
		{"--grpc-max-connection-idle", o.GRPCMaxConnectionIdle},
		{"--first-request-timeout", o.FirstRequestTimeout},
		{"--http-read-header-timeout", o.HTTPReadHeaderTimeout},
		{"--http-read-timeout", o.HTTPReadTimeout},
		{"--http-write-timeout", o.HTTPWriteTimeout},
		{"--http-idle-timeout", o.HTTPIdleTimeout},
	} {
		if d.v <= 0 {
			errs = append(errs, fmt.Errorf("%s must be positive", d.name))
		}
	}
	return errs
}

// listen opens a TCP listener, or a Unix socket for "unix:PATH" (a stale
// socket file left by an earlier run is replaced).
func listen(addr string) (net.Listener, error) {
	if path, ok := strings.CutPrefix(addr, "unix:"); ok {
		if st, err := os.Lstat(path); err == nil && st.Mode()&os.ModeSocket != 0 {
			_ = os.Remove(path)
		}
		return net.Listen("unix", path)
	}
	return net.Listen("tcp", addr)
}

// configDir is the directory that holds the config at path.
func configDir(path string) string {
	if st, err := os.Stat(path); err == nil && !st.IsDir() {
		return filepath.Dir(path)
	}
	return path
}

// sideListeners are the optional debug and metrics listeners.
type sideListeners struct {
	servers []*http.Server
	attrs   []any
}

// listenError is the error of a listener that could not open on addr,
// naming what sets the address: the flag and its variable, or the
// reference's variables when they set it.
func (o options) listenError(name, flagName, addr string, err error) error {
	return fmt.Errorf("%s listener on %s: %w; %s", name, addr, err, o.addrHint(flagName, addr))
}

// addrHint says what to change for another listen address of flagName,
// whose value is addr.
func (o options) addrHint(flagName, addr string) string {
	if o.reference != nil {
		if st, ok := o.reference.Lookup(flagName); ok && st.Value == addr && len(st.Vars) > 0 {
			return fmt.Sprintf("the address comes from the reference's %s (--%s): change %s, or give --%s",
				strings.Join(st.Vars, " and "), flagName, strings.Join(st.Vars, " or "), flagName)
		}
	}
	return fmt.Sprintf("change --%s (env %s) to a free address", flagName, envName(flagName))
}

func startSideListeners(o options, svc *rls.Service, reg *prometheus.Registry, log *slog.Logger) (*sideListeners, error) {
	sl := &sideListeners{}
	start := func(name, addr string, h http.Handler) error {
		lis, err := listen(addr)
		if err != nil {
			sl.close()
			return o.listenError(name, name+"-addr", addr, err)
		}
		srv := newHTTPServer(o.Listen, h)
		if name == "debug" {
			srv.WriteTimeout = 0 // CPU profiles and traces take their time
		}
		sl.servers = append(sl.servers, srv)
		sl.attrs = append(sl.attrs, name, lis.Addr().String())
		go func() {
			if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error(name+" server stopped", "error", err)
			}
		}()
		return nil
	}
	if o.Listen.DebugAddr != "" {
		if err := start("debug", o.Listen.DebugAddr, debugsrv.Handler(svc.Config)); err != nil {
			return nil, err
		}
	}
	if o.Listen.MetricsAddr != "" {
		mux := http.NewServeMux()
		mux.Handle("GET "+o.Listen.MetricsPath, promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
		if err := start("metrics", o.Listen.MetricsAddr, mux); err != nil {
			return nil, err
		}
	}
	return sl, nil
}

func (sl *sideListeners) shutdown(ctx context.Context) {
	for _, s := range sl.servers {
		if s.Shutdown(ctx) != nil {
			s.Close()
		}
	}
}

func (sl *sideListeners) close() {
	for _, s := range sl.servers {
		s.Close()
	}
}
