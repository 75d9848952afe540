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
	s := &server{o: o, log: o.Obs.newLogger(logOut)}
	log := s.log
	// Catch SIGHUP from the start: before the watcher runs, one would
	// otherwise kill the process. The watcher reloads on it.
	s.hup = make(chan os.Signal, 1)
	signal.Notify(s.hup, syscall.SIGHUP)
	logReference(o.reference, log)
	var (
		cfg     *descriptors.Config
		loadErr error // of the config at start, when serving without it
	)
	if o.Source.ConfigXDS == "" {
		var err error
		if cfg, err = descriptors.LoadWith(o.Source.Config, o.Source.Load.descriptorOptions()); err != nil {
			where := "loading config"
			if o.reference != nil {
				where = fmt.Sprintf("no --config given, so the config comes from the reference server's environment (RUNTIME_ROOT, RUNTIME_SUBDIRECTORY, RUNTIME_APPDIRECTORY, CONFIG_TYPE); loading %s", o.Source.Config)
			}
			if _, statErr := os.Stat(o.Source.Config); !o.Source.ForceStart || statErr != nil {
				// A missing path fails fast even when forced, as the
				// reference cannot watch a directory that is not there.
				return s, fmt.Errorf("%s:\n%v", where, err)
			}
			// As the reference server: serve without a config (calls fail
			// with "no rate limit configuration loaded") until a valid one
			// is loaded when the files change.
			loadErr = err
			log.Error("config not loaded; serving without one until a valid config is loaded (--force-start-without-initial-config)", "config", o.Source.Config, "errors", err.Error())
		}
		logWarnings(log, cfg)
	}
	s.reg = prometheus.NewRegistry()
	s.metrics = o.Obs.registerMetrics(s.reg)
	if cfg != nil || loadErr != nil {
		s.metrics.ConfigLoad(loadErr)
	}
	if cfg != nil {
		s.metrics.ConfigWarnings(len(cfg.Warnings()))
	}

	traceCfg := o.Obs.Tracing
	var err error
	if s.tracing, err = tracing.Setup(ctx, traceCfg, version); err != nil {
		return s, err
	}
	if traceCfg.Enabled {
		log.Info("tracing on", "protocol", traceCfg.Protocol, "service", traceCfg.ServiceName, "sampling_rate", traceCfg.SamplingRate)
	}

	// The store reports the requests its local fallback decided to the
	// service's failure log, which exists only once the service does.
	var svc atomic.Pointer[rls.Service]
	onFallback := func(err error) {
		if v := svc.Load(); v != nil {
			v.BackendFallback(err)
		}
	}
	if s.store, err = newStore(o, s.reg, log, onFallback); err != nil {
		return s, err
	}
	s.svc = rls.New(s.store, cfg, rls.Options{
		FailureMode:             o.Failure.Mode,
		BackendTimeout:          o.Failure.BackendTimeout,
		ShadowMode:              o.Decisions.ShadowMode,
		ResponseHeaders:         o.Response.Headers,
		LegacyHeaderNames:       o.Response.legacyNames(),
		QuotaMode:               o.Decisions.QuotaMode,
		UsageAccounting:         o.Decisions.UsageAccounting,
		OverLimitBody:           o.Response.body,
		NearLimitRatio:          o.Obs.NearLimitRatio,
		Tracer:                  s.tracing.Tracer,
		Propagator:              s.tracing.Propagator,
		Logger:                  log,
		Metrics:                 s.metrics,
		LogInterval:             o.Failure.LogInterval,
		ResponseDynamicMetadata: o.Response.DynamicMetadata,
	})
	svc.Store(s.svc)

	// The readiness, once made: the xDS client tells it of every config
	// it applies (health may require one).
	var readyNow atomic.Pointer[readiness]
	if o.Source.ConfigXDS != "" {
		apply := func(c *descriptors.Config) {
			s.svc.SetConfig(c)
			s.metrics.ConfigWarnings(len(c.Warnings()))
			if r := readyNow.Load(); r != nil {
				r.configChanged()
			}
		}
		client, err := o.Source.XDS.newClient(o.Source.ConfigXDS, o.Source.Load, apply, s.metrics.ConfigLoad, log)
		if err != nil {
			return s, err
		}
		xctx, cancel := context.WithCancel(context.Background())
		xdsDone := make(chan struct{})
		go func() { client.Run(xctx); close(xdsDone) }()
		s.stopXDS = func() { cancel(); <-xdsDone }
		if !o.Source.ForceStart {
			log.Info("waiting for the first config from the xDS control plane", "server", o.Source.ConfigXDS)
			select {
			case <-client.FirstConfig():
			case <-ctx.Done():
				s.close()
				return nil, nil
			}
		}
	}

	grpcOpts := grpcServerOptions(o.Listen)
	if o.Source.Load.RLQS {
		grpcOpts = append(grpcOpts, o.RLQS.serverOptions(o.Listen)...)
	}
	if o.GRPCTLS.on() {
		creds, err := o.GRPCTLS.serverOption(log)
		if err != nil {
			return s, err
		}
		grpcOpts = append(grpcOpts, creds)
	}
	if s.grpcLis, err = listen(o.Listen.GRPCAddr); err != nil {
		return s, fmt.Errorf("gRPC listener: %w", err)
	}
	limited := newLimitListener(s.grpcLis, o.Listen.GRPCMaxConnections)
	s.grpcLis = limited
	if err := limited.register(s.reg, "grpc", "--grpc-max-connections"); err != nil {
		return s, err
	}
	s.grpcSrv, s.health = rls.NewGRPCServer(s.svc, grpcOpts...)
	s.startRLQS()
	var hasConfig func() bool
	if o.Obs.HealthRequiresConfig {
		hasConfig = func() bool { return len(s.svc.Config().Domains()) > 0 }
	}
	s.ready = newReadiness(s.store, s.health, hasConfig)
	readyNow.Store(s.ready)
	s.ready.configChanged() // a config the xDS client applied meanwhile
	rctx, cancel := context.WithCancel(context.Background())
	readyDone := make(chan struct{})
	go func() {
		defer close(readyDone)
		s.ready.watch(rctx, s.store, log, max(o.Redis.Main.RedisDialTimeout, time.Second), o.Failure.LogInterval)
	}()
	s.stopReady = func() { cancel(); <-readyDone }

	if o.Listen.HTTPAddr != "" {
		if s.httpLis, err = net.Listen("tcp", o.Listen.HTTPAddr); err != nil {
			return s, fmt.Errorf("HTTP listener: %w", err)
		}
		limited := newLimitListener(s.httpLis, o.Listen.HTTPMaxConnections)
		s.httpLis = limited
		if err := limited.register(s.reg, "http", "--http-max-connections"); err != nil {
			return s, err
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
		s.httpSrv = newHTTPServer(o.Listen, mux)
	}

	if s.extra, err = startSideListeners(o.Listen, s.svc, s.reg, log); err != nil {
		return s, err
	}
	return s, nil
}

// newStore builds the configured backend.
func newStore(o options, reg prometheus.Registerer, log *slog.Logger, onFallback func(error)) (backend.Store, error) {
	switch o.Backend {
	case "redis":
		return newRedisStore(redisBackend{Redis: o.Redis, Failure: o.Failure, Fallback: o.Memory, CloseWriteBack: o.Listen.ShutdownGrace}, reg, log, onFallback)
	default:
		return o.Memory.newStore(reg), nil
	}
}
