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

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/envoyrls/envoy-rls/internal/debugsrv"
	"github.com/envoyrls/envoy-rls/pkg/rls"
)

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

func startSideListeners(o options, svc *rls.Service, reg *prometheus.Registry, log *slog.Logger) (*sideListeners, error) {
	sl := &sideListeners{}
	start := func(name, addr string, h http.Handler) error {
		lis, err := listen(addr)
		if err != nil {
			sl.close()
			return fmt.Errorf("%s listener: %w", name, err)
		}
		srv := newHTTPServer(o, h)
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
	if o.DebugAddr != "" {
		if err := start("debug", o.DebugAddr, debugsrv.Handler(svc.Config)); err != nil {
			return nil, err
		}
	}
	if o.MetricsAddr != "" {
		mux := http.NewServeMux()
		mux.Handle("GET "+o.MetricsPath, promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
		if err := start("metrics", o.MetricsAddr, mux); err != nil {
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
