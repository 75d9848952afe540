package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/envoyrls/envoy-rls/pkg/backend"
	"github.com/envoyrls/envoy-rls/pkg/backend/memory"
	"github.com/envoyrls/envoy-rls/pkg/descriptors"
	"github.com/envoyrls/envoy-rls/pkg/rls"
)

func newLogger(o options, out io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(o.LogLevel))
	hopts := &slog.HandlerOptions{Level: level}
	if o.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(out, hopts))
	}
	return slog.New(slog.NewTextHandler(out, hopts))
}

// serve runs the service until ctx ends, then shuts down gracefully.
func serve(ctx context.Context, o options, logOut io.Writer) error {
	log := newLogger(o, logOut)
	// Catch SIGHUP from the start: before the watcher runs, one would
	// otherwise kill the process. The watcher reloads on it.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	logReference(o, log)
	var cfg *descriptors.Config
	if o.ConfigXDS == "" {
		var err error
		if cfg, err = descriptors.Load(o.Config); err != nil {
			if o.reference != nil {
				return fmt.Errorf("no --config given, so the config comes from the reference server's environment (RUNTIME_ROOT, RUNTIME_SUBDIRECTORY, RUNTIME_APPDIRECTORY, CONFIG_TYPE); loading %s:\n%v", o.Config, err)
			}
			return fmt.Errorf("loading config:\n%v", err)
		}
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics := rls.NewMetrics(reg)
	if o.ReferenceMetrics {
		metrics.EnableReference(reg, referenceNearLimitRatio)
	}
	if cfg != nil {
		metrics.ConfigLoad(nil)
	}

	store, err := newStore(o, reg, log)
	if err != nil {
		return err
	}
	defer store.Close()

	mode, _ := rls.ParseFailureMode(o.FailureMode) // validated
	svc := rls.New(store, cfg, rls.Options{
		FailureMode:     mode,
		BackendTimeout:  o.BackendTimeout,
		ShadowMode:      o.ShadowMode,
		ResponseHeaders: o.ResponseHeaders,
		Logger:          log,
		Metrics:         metrics,
	})

	xctx, stopXDS := context.WithCancel(context.Background())
	defer stopXDS()
	if o.ConfigXDS != "" {
		client, err := newXDSClient(o, svc, metrics, log)
		if err != nil {
			return err
		}
		xdsDone := make(chan struct{})
		go func() { client.Run(xctx); close(xdsDone) }()
		defer func() { stopXDS(); <-xdsDone }()
		if !o.ForceStart {
			log.Info("waiting for the first config from the xDS control plane", "server", o.ConfigXDS)
			select {
			case <-client.FirstConfig():
			case <-ctx.Done():
				return nil
			}
		}
	}

	grpcOpts := grpcServerOptions(o)
	if o.GRPCTLSCert != "" {
		creds, err := grpcServerTLS(o, log)
		if err != nil {
			return err
		}
		grpcOpts = append(grpcOpts, creds)
	}
	grpcLis, err := listen(o.GRPCAddr)
	if err != nil {
		return fmt.Errorf("gRPC listener: %w", err)
	}
	grpcSrv, health := rls.NewGRPCServer(svc, grpcOpts...)

	var httpSrv *http.Server
	var httpLis net.Listener
	// shuttingDown turns GET /healthz to 503 as soon as shutdown begins,
	// while calls in flight finish.
	var shuttingDown atomic.Bool
	if o.HTTPAddr != "" {
		httpLis, err = net.Listen("tcp", o.HTTPAddr)
		if err != nil {
			grpcLis.Close()
			return fmt.Errorf("HTTP listener: %w", err)
		}
		mux := http.NewServeMux()
		mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
			if !shuttingDown.Load() {
				fmt.Fprintln(w, "OK")
				return
			}
			http.Error(w, "shutting down", http.StatusServiceUnavailable)
		})
		mux.HandleFunc("GET /healthcheck", func(w http.ResponseWriter, _ *http.Request) {
			if shuttingDown.Load() || (o.HealthRequiresConfig && len(svc.Config().Domains()) == 0) {
				w.WriteHeader(http.StatusInternalServerError)
				return
			}
			fmt.Fprint(w, "OK")
		})
		mux.Handle("/json", svc.JSONHandler())
		mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
		httpSrv = newHTTPServer(o, mux)
		go func() {
			if err := httpSrv.Serve(httpLis); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("HTTP server stopped", "error", err)
			}
		}()
	}

	extra, err := startSideListeners(o, svc, reg, log)
	if err != nil {
		grpcLis.Close()
		if httpLis != nil {
			httpLis.Close()
		}
		return err
	}
	defer extra.close()

	reload := func(reason string) {
		if o.ConfigXDS != "" {
			return // the control plane sends every change
		}
		next, err := descriptors.Load(o.Config)
		metrics.ConfigLoad(err)
		if err != nil {
			log.Error("config reload failed; the previous config keeps serving", "reason", reason, "errors", err.Error())
			return
		}
		svc.SetConfig(next)
		log.Info("config reloaded", "reason", reason, "domains", len(next.Domains()))
	}
	stopWatch := watchConfig(ctx, o, log, hup, reload)
	defer stopWatch()

	grpcErr := make(chan error, 1)
	go func() { grpcErr <- grpcSrv.Serve(grpcLis) }()
	source := o.Config
	if o.ConfigXDS != "" {
		source = "xds://" + o.ConfigXDS
	}
	attrs := []any{"grpc", grpcLis.Addr().String(), "backend", o.Backend, "config", source, "domains", len(svc.Config().Domains()), "grpc_tls", o.GRPCTLSCert != ""}
	attrs = append(attrs, extra.attrs...)
	if httpLis != nil {
		attrs = append(attrs, "http", httpLis.Addr().String())
	}
	log.Info("envoy-rls serving", attrs...)

	select {
	case err := <-grpcErr:
		return fmt.Errorf("gRPC server: %w", err)
	case <-ctx.Done():
	}
	log.Info("shutting down")
	// A second SIGINT or SIGTERM during the grace period exits at once.
	force := make(chan os.Signal, 1)
	signal.Notify(force, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(force)
	go func() {
		if _, ok := <-force; ok {
			log.Warn("second signal: exiting without waiting for calls in flight")
			os.Exit(1)
		}
	}()
	health.Shutdown() // every service NOT_SERVING
	shuttingDown.Store(true)
	// One grace period for both servers. The HTTP server keeps answering
	// (/healthz with 503) while gRPC drains, then drains in what is left.
	sctx, cancel := context.WithTimeout(context.Background(), o.ShutdownGrace)
	defer cancel()
	done := make(chan struct{})
	go func() { grpcSrv.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-sctx.Done():
		grpcSrv.Stop()
	}
	if httpSrv != nil && httpSrv.Shutdown(sctx) != nil {
		httpSrv.Close()
	}
	extra.shutdown(sctx)
	return nil
}

// newStore builds the configured backend.
func newStore(o options, reg prometheus.Registerer, log *slog.Logger) (backend.Store, error) {
	switch o.Backend {
	case "redis":
		return newRedisStore(o, reg, log)
	default:
		m := memory.New(memory.WithMaxKeys(o.MaxKeys))
		registerMemoryMetrics(reg, m)
		return m, nil
	}
}

// watchConfig reloads the config on SIGHUP and, with --watch-config, when a
// file in the config's directory changes (writes, renames, and the symlink
// swaps of a Kubernetes ConfigMap). Bursts of events are folded into one
// reload. It returns a function that stops watching.
func watchConfig(ctx context.Context, o options, log *slog.Logger, hup <-chan os.Signal, reload func(reason string)) func() {
	ctx, cancel := context.WithCancel(ctx)
	var events <-chan fsnotify.Event
	var watchErrs <-chan error
	var w *fsnotify.Watcher
	if o.WatchConfig && o.Config != "" {
		var err error
		w, err = fsnotify.NewWatcher()
		if err == nil {
			err = w.Add(configDir(o.Config))
			if err == nil && o.WatchRoot != "" {
				// The reference's RUNTIME_WATCH_ROOT: RUNTIME_ROOT itself
				// may be replaced (a symlink swapped), which only its
				// parent directory sees.
				err = w.Add(filepath.Dir(filepath.Clean(o.WatchRoot)))
			}
		}
		if err != nil {
			log.Warn("cannot watch the config; reload with SIGHUP", "error", err)
		} else {
			events, watchErrs = w.Events, w.Errors
		}
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		const settle = 200 * time.Millisecond
		timer := time.NewTimer(time.Hour)
		timer.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				reload("SIGHUP")
			case ev, ok := <-events:
				if !ok {
					events = nil
					continue
				}
				if ev.Op == fsnotify.Chmod {
					continue
				}
				if o.WatchRoot != "" && filepath.Dir(ev.Name) == filepath.Dir(filepath.Clean(o.WatchRoot)) && ev.Name != filepath.Clean(o.WatchRoot) {
					continue // another entry next to the root
				}
				timer.Reset(settle)
			case err, ok := <-watchErrs:
				if !ok {
					watchErrs = nil
					continue
				}
				log.Warn("config watch error", "error", err)
			case <-timer.C:
				reload("file change")
				if w != nil && o.WatchRoot != "" {
					// After a root swap the config directory is a new
					// one: watch it by its path again.
					_ = w.Add(configDir(o.Config))
				}
			}
		}
	}()
	return func() {
		cancel()
		if w != nil {
			w.Close()
		}
		wg.Wait()
	}
}
