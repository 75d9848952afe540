package main

// The server's life after build: reload, run, shutdown and close.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// close releases what build made: the side listeners, the xDS client, the
// gRPC server and the main listeners (when serving never started), the
// store and the SIGHUP catch. It is safe on a server that build left half made.
func (s *server) close() {
	if s.tracing != nil {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := s.tracing.Shutdown(sctx); err != nil {
			s.log.Warn("flushing traces", "error", err)
		}
		cancel()
		s.tracing = nil
	}
	if s.extra != nil {
		s.extra.close()
		s.extra = nil
	}
	if s.stopXDS != nil {
		s.stopXDS()
		s.stopXDS = nil
	}
	if s.grpcSrv != nil {
		// Stopped already when it served; else its stream workers end.
		s.grpcSrv.Stop()
	}
	if s.grpcLis != nil {
		s.grpcLis.Close()
		s.grpcLis = nil
	}
	if s.httpLis != nil {
		s.httpLis.Close()
		s.httpLis = nil
	}
	if s.stopReady != nil {
		s.stopReady()
		s.stopReady = nil
	}
	if s.rlqs != nil {
		s.rlqs.Close()
		s.rlqs = nil
	}
	if s.svc != nil {
		// No more calls: the backend failure log stops probing.
		s.svc.Close()
	}
	if s.store != nil {
		// A Redis store writes back the hits allowed while Redis was away,
		// for up to --shutdown-grace; the error names what it could not.
		if p, ok := s.store.(interface{ WriteBackPending() int }); ok {
			if n := p.WriteBackPending(); n > 0 {
				s.log.Info("writing back the hits allowed while Redis was away", "keys", n, "within", s.o.Listen.ShutdownGrace.String())
			}
		}
		if err := s.store.Close(); err != nil {
			s.log.Warn("closing the backend", "error", err)
		}
		s.store = nil
	}
	signal.Stop(s.hup)
}

// reload loads the config files again and swaps them in; on error the
// previous config keeps serving. With --config-xds it does nothing: the
// control plane sends every change.
func (s *server) reload(reason string) {
	if s.o.Source.ConfigXDS != "" {
		return
	}
	next, err := s.loadFiles()
	if err != nil {
		if s.svc.Config() == nil {
			s.log.Error("config reload failed; still serving without a config", "reason", reason, "errors", err.Error())
		} else {
			s.log.Error("config reload failed; the previous config keeps serving", "reason", reason, "errors", err.Error())
		}
		return
	}
	s.applyConfig(next)
	s.log.Info("config reloaded", "reason", reason, "domains", len(next.Domains()))
}

// run serves until ctx ends, then shuts down gracefully. It returns early
// with an error when the gRPC server fails.
func (s *server) run(ctx context.Context) error {
	o, log := s.o, s.log
	grpcLis, httpLis := s.grpcLis, s.httpLis
	if s.httpSrv != nil {
		go func() {
			if err := s.httpSrv.Serve(httpLis); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("HTTP server stopped", "error", err)
			}
		}()
	}
	stopWatch := watchConfig(ctx, o.Source, log, s.hup, s.reload)
	defer stopWatch()

	grpcErr := make(chan error, 1)
	go func() { grpcErr <- s.grpcSrv.Serve(grpcLis) }()
	// The servers own the listeners now.
	s.grpcLis, s.httpLis = nil, nil
	attrs := []any{"grpc", grpcLis.Addr().String(), "backend", o.Backend, "backend_selected_by", o.BackendFrom, "config", o.Source.name(), "domains", len(s.svc.Config().Domains()), "grpc_tls", o.GRPCTLS.on()}
	attrs = append(attrs, s.extra.attrs...)
	if httpLis != nil {
		attrs = append(attrs, "http", httpLis.Addr().String())
	}
	log.Info("envoy-rls serving", attrs...)

	select {
	case err := <-grpcErr:
		return fmt.Errorf("gRPC server: %w", err)
	case <-ctx.Done():
	}
	s.shutdown()
	return nil
}

// shutdown marks the service NOT_SERVING and lets the calls in flight finish
// within --shutdown-grace; a second SIGINT or SIGTERM exits at once.
func (s *server) shutdown() {
	log := s.log
	start := time.Now()
	log.Info("shutting down", "grace", s.o.Listen.ShutdownGrace.String())
	force := make(chan os.Signal, 1)
	signal.Notify(force, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(force)
	go func() {
		if _, ok := <-force; ok {
			log.Warn("second signal: exiting without waiting for calls in flight")
			os.Exit(1)
		}
	}()
	s.ready.stop() // every gRPC health service NOT_SERVING, /healthz 503
	// One grace period for both servers. The HTTP server keeps answering
	// (/healthz with 503) while gRPC drains, then drains in what is left.
	sctx, cancel := context.WithTimeout(context.Background(), s.o.Listen.ShutdownGrace)
	defer cancel()
	done := make(chan struct{})
	if s.rlqs != nil {
		// RLQS streams last as long as Envoy runs: end them (without
		// abandoning any bucket) so that the graceful stop can finish.
		s.rlqs.Shutdown()
	}
	go func() { s.grpcSrv.GracefulStop(); close(done) }()
	cut := false
	select {
	case <-done:
	case <-sctx.Done():
		s.grpcSrv.Stop()
		cut = true
	}
	if s.httpSrv != nil && s.httpSrv.Shutdown(sctx) != nil {
		s.httpSrv.Close()
		cut = true
	}
	s.extra.shutdown(sctx)
	took := time.Since(start).Round(time.Millisecond).String()
	if cut {
		log.Warn("shutdown complete; calls still in flight after --shutdown-grace were cut off", "took", took)
		return
	}
	log.Info("shutdown complete", "took", took)
}
