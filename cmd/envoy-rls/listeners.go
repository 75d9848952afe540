package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/envoyrls/envoy-rls/internal/certreload"
	"github.com/envoyrls/envoy-rls/internal/debugsrv"
	"github.com/envoyrls/envoy-rls/internal/refenv"
	"github.com/envoyrls/envoy-rls/pkg/descriptors"
	"github.com/envoyrls/envoy-rls/pkg/rls"
	"github.com/envoyrls/envoy-rls/pkg/xdsconfig"
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

// grpcServerTLS returns the gRPC server's TLS credentials; the files are
// re-read when they change.
func grpcServerTLS(o options, log *slog.Logger) (grpc.ServerOption, error) {
	srv, err := certreload.New(certreload.Options{
		CertFile: o.GRPCTLSCert, KeyFile: o.GRPCTLSKey,
		ClientCAFile: o.GRPCTLSClientCA, ClientSAN: o.GRPCTLSClientSAN,
		Logger: log,
	})
	if err != nil {
		return nil, fmt.Errorf("--grpc-tls-cert/--grpc-tls-key/--grpc-tls-client-ca: %v", err)
	}
	return grpc.Creds(credentials.NewTLS(srv.Config())), nil
}

// newXDSClient builds the client of --config-xds. Every valid config it
// receives replaces the service's config.
// applied is called after every config the client applies.
func newXDSClient(o options, svc *rls.Service, metrics *rls.Metrics, log *slog.Logger, applied func()) (*xdsconfig.Client, error) {
	tlsConf, err := xdsTLSConfig(o)
	if err != nil {
		return nil, err
	}
	headers, _ := refenv.ParseHeaders(o.XDSHeaders) // validated
	return xdsconfig.New(xdsconfig.Options{
		Addr:           o.ConfigXDS,
		NodeID:         o.XDSNodeID,
		NodeMetadata:   xdsNodeMetadata(o.XDSNodeMetadata),
		TLS:            tlsConf,
		Headers:        headers,
		MaxMessageSize: o.XDSMaxMessageSize,
		Backoff: xdsconfig.Backoff{
			Initial: o.XDSBackoffInitial, Max: o.XDSBackoffMax,
			RandomFactor: o.XDSBackoffRandomFactor, Jitter: o.XDSBackoffJitter,
		},
		MergeDomains: o.MergeDomainConfig,
		Lenient:      o.ConfigLenient,
		OrderFree:    o.RLQS,
		Apply: func(c *descriptors.Config) {
			svc.SetConfig(c)
			metrics.ConfigWarnings(len(c.Warnings()))
			applied()
		},
		Loaded: metrics.ConfigLoad,
		Logger: log,
	})
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

// logReference logs, once and at debug level, the reference server's
// variables that were set but mean nothing here.
func logReference(o options, log *slog.Logger) {
	if o.reference == nil {
		return
	}
	log.Info("no --config or --config-xds: configured from the reference server's environment (envoyproxy/ratelimit)")
	for _, ig := range o.reference.Ignored {
		log.Debug("reference variable accepted without effect", "variable", ig.Var, "reason", ig.Reason)
	}
	for _, s := range o.reference.Settings {
		v := s.Value
		switch {
		case strings.Contains(s.Flag, "password"):
			v = "xxxxx"
		case s.Flag == "redis-url":
			if u, err := url.Parse(v); err == nil {
				v = u.Redacted()
			}
		}
		log.Debug("reference setting", "flag", "--"+s.Flag, "value", v, "from", s.From)
	}
}
