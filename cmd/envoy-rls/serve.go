package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"

	"github.com/envoyrls/envoy-rls/internal/tracing"
	"github.com/envoyrls/envoy-rls/pkg/backend"
	"github.com/envoyrls/envoy-rls/pkg/descriptors"
	"github.com/envoyrls/envoy-rls/pkg/rlqs"
	"github.com/envoyrls/envoy-rls/pkg/rls"
)

// serve runs the service until ctx ends, then shuts down gracefully.
func serve(ctx context.Context, o options, logOut io.Writer) error {
	s, err := build(ctx, o, logOut)
	if s != nil {
		defer s.close()
	}
	if err != nil || s == nil {
		return err
	}
	return s.run(ctx)
}

// server is everything serve builds before it serves: the config, metrics,
// store, service, the xDS client and the listeners.
type server struct {
	o       options
	log     *slog.Logger
	hup     chan os.Signal // SIGHUP, caught from the start
	reg     *prometheus.Registry
	metrics *rls.Metrics
	store   backend.Store
	svc     *rls.Service
	rlqs    *rlqs.Service // nil without --rlqs
	stopXDS func()        // stops the xDS client and waits for it; nil without one
	tracing *tracing.Tracing

	grpcLis net.Listener
	grpcSrv *grpc.Server
	health  *health.Server
	httpLis net.Listener // nil without --http-addr
	httpSrv *http.Server
	extra   *sideListeners

	// ready is what /healthz, /healthcheck and gRPC health report: not
	// ready until the backend answered once (at once for the memory store;
	// the reference's /healthcheck waits for its first Redis PING too),
	// nor from shutdown on.
	ready     *readiness
	stopReady func() // stops the readiness check and waits for it
}

// build loads the config (or, with --config-xds, starts the xDS client and
// waits for its first config unless --force-start), makes the store and the
// service, and opens the listeners; the side listeners start serving. It
// returns a nil server and no error when ctx ends while it waits for the
// control plane. The caller closes a non-nil server, also on error.
func build(ctx context.Context, o options, logOut io.Writer) (*server, error) {
	s := newServer(o, logOut)
	logReference(o.reference, s.log)
	cfg, err := s.firstConfig()
	if err != nil {
		return s, err
	}
	if err := s.startTracing(ctx); err != nil {
		return s, err
	}
	if err := s.newService(cfg); err != nil {
		return s, err
	}
	if err := s.newGRPCServer(); err != nil {
		return s, err
	}
	if o.Source.ConfigXDS != "" {
		if ok, err := s.startXDS(ctx); err != nil || !ok {
			if !ok {
				s.close()
				return nil, nil
			}
			return s, err
		}
	}
	if err := s.openListeners(); err != nil {
		return s, err
	}
	if s.extra, err = startSideListeners(o, s.svc, s.reg, s.log); err != nil {
		return s, err
	}
	return s, nil
}

// newServer returns a server with its logger and metrics, catching SIGHUP
// from now on: before the watcher runs, one would otherwise kill the
// process. The watcher reloads on it.
func newServer(o options, logOut io.Writer) *server {
	s := &server{o: o, log: o.Obs.newLogger(logOut), reg: prometheus.NewRegistry()}
	s.hup = make(chan os.Signal, 1)
	signal.Notify(s.hup, syscall.SIGHUP)
	s.metrics = o.Obs.registerMetrics(s.reg)
	return s
}

// firstConfig loads the config files at start (nil with --config-xds). A
// config that does not load stops the start, unless
// --force-start-without-initial-config and its path exists: then the
// service starts without one, as the reference server does (calls fail with
// "no rate limit configuration loaded" until a valid one is loaded when the
// files change), and firstConfig returns nil.
func (s *server) firstConfig() (*descriptors.Config, error) {
	src := s.o.Source
	if src.ConfigXDS != "" {
		return nil, nil
	}
	cfg, err := s.loadFiles()
	if err == nil {
		return cfg, nil
	}
	where := "loading config"
	if s.o.reference != nil {
		where = fmt.Sprintf("no --config given, so the config comes from the reference server's environment (RUNTIME_ROOT, RUNTIME_SUBDIRECTORY, RUNTIME_APPDIRECTORY, CONFIG_TYPE); loading %s", src.Config)
	}
	if _, statErr := os.Stat(src.Config); !src.ForceStart || statErr != nil {
		// A missing path fails fast even when forced, as the reference
		// cannot watch a directory that is not there.
		return nil, fmt.Errorf("%s:\n%v", where, err)
	}
	s.log.Error("config not loaded; serving without one until a valid config is loaded (--force-start-without-initial-config)", "config", src.Config, "errors", err.Error())
	return nil, nil
}

// loadFiles loads the config files, counts the outcome in the metrics and
// logs what --config-lenient accepted.
func (s *server) loadFiles() (*descriptors.Config, error) {
	cfg, err := descriptors.LoadWith(s.o.Source.Config, s.o.Source.Load.descriptorOptions())
	s.metrics.ConfigLoad(err)
	if err != nil {
		return nil, err
	}
	logWarnings(s.log, cfg)
	return cfg, nil
}

// applyConfig puts cfg in use, whoever loaded it (the files at start and
// on reload, the xDS client): the service decides with it, the metrics
// count its warnings, and health follows it (--health-requires-config).
func (s *server) applyConfig(cfg *descriptors.Config) {
	s.svc.SetConfig(cfg)
	s.metrics.ConfigWarnings(len(cfg.Warnings()))
	if s.ready != nil {
		s.ready.configChanged()
	}
}

// startTracing sets the tracer up as the environment asks.
func (s *server) startTracing(ctx context.Context) error {
	c := s.o.Obs.Tracing
	var err error
	if s.tracing, err = tracing.Setup(ctx, c, version); err != nil {
		return err
	}
	if c.Enabled {
		s.log.Info("tracing on", "protocol", c.Protocol, "service", c.ServiceName, "sampling_rate", c.SamplingRate)
	}
	return nil
}

// newService makes the store and the service, deciding with cfg (nil: no
// config yet).
func (s *server) newService(cfg *descriptors.Config) error {
	o := s.o
	// The store reports the requests its local fallback decided to the
	// service's failure log, which exists only once the service does.
	var svc atomic.Pointer[rls.Service]
	onFallback := func(err error) {
		if v := svc.Load(); v != nil {
			v.BackendFallback(err)
		}
	}
	var err error
	if s.store, err = newStore(o, s.reg, s.log, onFallback); err != nil {
		return err
	}
	s.svc = rls.New(s.store, nil, rls.Options{
		FailureMode:             o.Failure.Mode,
		BackendTimeout:          o.Failure.BackendTimeout,
		LogInterval:             o.Failure.LogInterval,
		ShadowMode:              o.Decisions.ShadowMode,
		QuotaMode:               o.Decisions.QuotaMode,
		UsageAccounting:         o.Decisions.UsageAccounting,
		Consistency:             o.Decisions.Consistency,
		ResponseHeaders:         o.Response.Headers,
		LegacyHeaderNames:       o.Response.legacyNames(),
		OverLimitBody:           o.Response.body,
		ResponseDynamicMetadata: o.Response.DynamicMetadata,
		NearLimitRatio:          o.Obs.NearLimitRatio,
		Tracer:                  s.tracing.Tracer,
		Propagator:              s.tracing.Propagator,
		Logger:                  s.log,
		Metrics:                 s.metrics,
	})
	svc.Store(s.svc)
	if cfg != nil {
		s.applyConfig(cfg)
	}
	return nil
}

// newGRPCServer makes the gRPC server (not listening yet) with RLS, health
// and, with --rlqs, RLQS, and the readiness its health reports, which
// starts checking the backend.
func (s *server) newGRPCServer() error {
	o := s.o
	opts := grpcServerOptions(o.Listen)
	if o.Source.Load.RLQS {
		opts = append(opts, o.RLQS.serverOptions(o.Listen)...)
	}
	if o.GRPCTLS.on() {
		creds, err := o.GRPCTLS.credentials(s.log)
		if err != nil {
			return err
		}
		opts = append(opts, grpc.Creds(h2Credentials{creds}))
	}
	s.grpcSrv, s.health = rls.NewGRPCServer(s.svc, opts...)
	s.startRLQS()
	var hasConfig func() bool
	if o.Obs.HealthRequiresConfig {
		hasConfig = func() bool { return len(s.svc.Config().Domains()) > 0 }
	}
	s.ready = newReadiness(s.store, s.health, hasConfig)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.ready.watch(ctx, s.store, s.log, max(o.Redis.Main.RedisDialTimeout, time.Second), o.Failure.LogInterval)
	}()
	s.stopReady = func() { cancel(); <-done }
	return nil
}

// startXDS starts the client of --config-xds, which applies every valid
// config it receives, and waits for the first one unless
// --force-start-without-initial-config. It returns false when ctx ended
// meanwhile.
func (s *server) startXDS(ctx context.Context) (bool, error) {
	src := s.o.Source
	client, err := src.XDS.newClient(src.ConfigXDS, src.Load, s.applyConfig, s.metrics.ConfigLoad, s.log)
	if err != nil {
		return true, err
	}
	xctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { client.Run(xctx); close(done) }()
	s.stopXDS = func() { cancel(); <-done }
	if src.ForceStart {
		return true, nil
	}
	s.log.Info("waiting for the first config from the xDS control plane", "server", src.ConfigXDS)
	select {
	case <-client.FirstConfig():
		return true, nil
	case <-ctx.Done():
		return false, nil
	}
}

// openListeners opens the gRPC listener and, with --http-addr, the HTTP
// one with its server (/healthz, /healthcheck, /json, /metrics), each
// bounded in connections.
func (s *server) openListeners() error {
	o := s.o.Listen
	var err error
	if s.grpcLis, err = listen(o.GRPCAddr); err != nil {
		return s.o.listenError("gRPC", "grpc-addr", o.GRPCAddr, err)
	}
	limited := grpcConnListener(s.grpcLis, o.GRPCMaxConnections, o.FirstRequestTimeout, s.o.GRPCTLS.on())
	s.grpcLis = limited
	if err := limited.register(s.reg, connMetrics{open: rls.GRPCConnections, refused: rls.GRPCConnectionsRefused,
		evicted: rls.GRPCConnectionsEvicted, firstRequestTimeouts: rls.GRPCFirstRequestTimeouts}); err != nil {
		return err
	}
	if o.HTTPAddr == "" {
		return nil
	}
	if s.httpLis, err = net.Listen("tcp", o.HTTPAddr); err != nil {
		return s.o.listenError("HTTP", "http-addr", o.HTTPAddr, err)
	}
	limited = newLimitListener(s.httpLis, o.HTTPMaxConnections, o.HTTPReservedConnections)
	s.httpLis = limited
	if err := limited.register(s.reg, connMetrics{open: rls.HTTPConnections, refused: rls.HTTPConnectionsRefused,
		evicted: rls.HTTPConnectionsEvicted, reserved: rls.HTTPConnectionsReserved}); err != nil {
		return err
	}
	mux := http.NewServeMux()
	// 503 with the reason until the backend answered once, and from
	// shutdown on while calls in flight finish.
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		if ok, why := s.ready.status(); !ok {
			http.Error(w, why, http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "OK")
	})
	mux.HandleFunc("GET /healthcheck", func(w http.ResponseWriter, _ *http.Request) {
		if ok, _ := s.ready.status(); !ok {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		fmt.Fprint(w, "OK")
	})
	mux.Handle("/json", s.svc.JSONHandler())
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{Registry: s.reg}))
	s.httpSrv = newHTTPServer(o, limited.httpHandler(mux, healthPaths))
	limited.trackHTTP(s.httpSrv)
	return nil
}

// healthPaths are the paths a connection on the HTTP reserve may ask for:
// readiness, and /metrics, which deploy/kubernetes probes for liveness
// (and Prometheus scrapes, most wanted during a flood).
var healthPaths = map[string]bool{"/healthz": true, "/healthcheck": true, "/metrics": true}

// newStore builds the configured backend.
func newStore(o options, reg prometheus.Registerer, log *slog.Logger, onFallback func(error)) (backend.Store, error) {
	switch o.Backend {
	case "redis":
		return newRedisStore(redisBackend{Redis: o.Redis, Failure: o.Failure, Fallback: o.Memory, CloseWriteBack: o.Listen.ShutdownGrace}, reg, log, onFallback)
	default:
		return o.Memory.newStore(reg), nil
	}
}
