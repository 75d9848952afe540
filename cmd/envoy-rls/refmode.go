package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/envoyrls/envoy-rls/internal/refenv"
	"github.com/envoyrls/envoy-rls/pkg/xdsconfig"
)

// xdsOptions are the settings of the config over xDS, gRPC server TLS, the
// debug and metrics listeners, and what the reference server's environment
// adds (issue 10).
type xdsOptions struct {
	loadOptions

	ConfigXDS              string
	XDSNodeID              string
	XDSNodeMetadata        string
	XDSHeaders             string
	XDSTLS                 bool
	XDSTLSCert             string
	XDSTLSKey              string
	XDSTLSCA               string
	XDSTLSServerName       string
	XDSBackoffInitial      time.Duration
	XDSBackoffMax          time.Duration
	XDSBackoffRandomFactor float64
	XDSBackoffJitter       bool
	XDSMaxMessageSize      int
	ForceStart             bool

	GRPCTLSCert      string
	GRPCTLSKey       string
	GRPCTLSClientCA  string
	GRPCTLSClientSAN string

	DebugAddr   string
	MetricsAddr string
	MetricsPath string
	WatchRoot   string

	// reference is the reference environment's translation when it was
	// read (no --config and no --config-xds given), else nil.
	reference *refenv.Result
}

func addXDSFlags(fs *flag.FlagSet, o *xdsOptions) {
	addFileFlags(fs, &o.loadOptions)
	fs.StringVar(&o.ConfigXDS, "config-xds", "", "take the descriptor config from this xDS control plane (host:port; ADS, state of the world, type ratelimit.config.ratelimit.v3.RateLimitConfig) instead of --config")
	fs.StringVar(&o.XDSNodeID, "xds-node-id", "envoy-ratelimit", "node id sent to the xDS control plane (Envoy Gateway serves envoy-ratelimit)")
	fs.StringVar(&o.XDSNodeMetadata, "xds-node-metadata", "", "node metadata sent to the control plane: key=value[,key=value...]")
	fs.StringVar(&o.XDSHeaders, "xds-headers", "", "gRPC metadata added to the xDS stream: key:value[,key:value...]")
	fs.BoolVar(&o.XDSTLS, "xds-tls", false, "connect to the control plane with TLS (implied by the other --xds-tls-* flags)")
	fs.StringVar(&o.XDSTLSCert, "xds-tls-cert", "", "PEM client certificate presented to the control plane (mutual TLS), with --xds-tls-key")
	fs.StringVar(&o.XDSTLSKey, "xds-tls-key", "", "PEM private key of --xds-tls-cert")
	fs.StringVar(&o.XDSTLSCA, "xds-tls-ca", "", "PEM CA bundle that verifies the control plane instead of the system roots")
	fs.StringVar(&o.XDSTLSServerName, "xds-tls-server-name", "", "name verified in the control plane's certificate (default: the --config-xds host)")
	fs.DurationVar(&o.XDSBackoffInitial, "xds-backoff-initial", xdsconfig.DefaultBackoff.Initial, "first wait before reconnecting to the control plane; it doubles per failure")
	fs.DurationVar(&o.XDSBackoffMax, "xds-backoff-max", xdsconfig.DefaultBackoff.Max, "longest wait before reconnecting to the control plane")
	fs.Float64Var(&o.XDSBackoffRandomFactor, "xds-backoff-random-factor", xdsconfig.DefaultBackoff.RandomFactor, "spread of each reconnect wait, 0 to 1 (with --xds-backoff-jitter)")
	fs.BoolVar(&o.XDSBackoffJitter, "xds-backoff-jitter", xdsconfig.DefaultBackoff.Jitter, "randomize reconnect waits by --xds-backoff-random-factor")
	fs.IntVar(&o.XDSMaxMessageSize, "xds-max-message-size", 0, "largest xDS response accepted, in bytes (0: gRPC's 4 MiB)")
	fs.BoolVar(&o.ForceStart, "force-start-without-initial-config", false, "serve without a config: with --config-xds before the first one arrives, with --config when its files are there but do not load at start (then the next valid one is loaded as files change; a missing path exits 1); calls fail with \"no rate limit configuration loaded\" until then. Without it --config-xds waits and a --config that does not load exits 1")
	fs.StringVar(&o.GRPCTLSCert, "grpc-tls-cert", "", "PEM certificate of the gRPC server (TLS), with --grpc-tls-key; re-read when the file changes")
	fs.StringVar(&o.GRPCTLSKey, "grpc-tls-key", "", "PEM private key of --grpc-tls-cert")
	fs.StringVar(&o.GRPCTLSClientCA, "grpc-tls-client-ca", "", "PEM CA bundle: require gRPC clients to present a certificate it signed (mutual TLS)")
	fs.StringVar(&o.GRPCTLSClientSAN, "grpc-tls-client-san", "", "with --grpc-tls-client-ca: require this DNS name or IP in the client certificate")
	fs.StringVar(&o.DebugAddr, "debug-addr", "", "debug listener: /rlconfig (the loaded limits), /debug/pprof/; empty disables it")
	fs.StringVar(&o.MetricsAddr, "metrics-addr", "", "a separate Prometheus listener (as the reference's PROMETHEUS_ADDR); /metrics on --http-addr stays")
	fs.StringVar(&o.MetricsPath, "metrics-path", "/metrics", "path of the Prometheus metrics on --metrics-addr")
	fs.StringVar(&o.WatchRoot, "watch-root", "", "also reload when this directory (or symlink) is replaced, as the reference's RUNTIME_WATCH_ROOT does for RUNTIME_ROOT")
}

// lookupEnv reads the reference server's variables (tests replace it).
var lookupEnv refenv.Lookup = os.LookupEnv

// applyReference reads the reference server's environment when neither
// --config nor --config-xds was given (on the command line or as
// ENVOY_RLS_*), and sets every flag that was not given from it.
func applyReference(fs *flag.FlagSet, o *options, lookup refenv.Lookup) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	if given["config"] || given["config-xds"] {
		return nil
	}
	res, err := refenv.Translate(lookup)
	if err != nil {
		return fmt.Errorf("no --config or --config-xds: reading the reference server's environment (envoyproxy/ratelimit):\n%v", err)
	}
	var errs []error
	for _, s := range res.Settings {
		if given[s.Flag] {
			continue
		}
		if fs.Lookup(s.Flag) == nil {
			errs = append(errs, fmt.Errorf("%s is not supported by this build of envoy-rls (no --%s)", s.From, s.Flag))
			continue
		}
		if err := fs.Set(s.Flag, s.Value); err != nil {
			errs = append(errs, fmt.Errorf("%s: --%s=%q: %v", s.From, s.Flag, s.Value, err))
		}
	}
	o.reference = res
	return errors.Join(errs...)
}

// validateXDS checks the settings of this file together.
func (o options) validateXDS() []error {
	var errs []error
	if o.ConfigXDS != "" && o.Config != "" {
		errs = append(errs, errors.New("--config and --config-xds exclude each other"))
	}
	if (o.XDSTLSCert == "") != (o.XDSTLSKey == "") {
		errs = append(errs, errors.New("--xds-tls-cert and --xds-tls-key go together"))
	}
	if (o.GRPCTLSCert == "") != (o.GRPCTLSKey == "") {
		errs = append(errs, errors.New("--grpc-tls-cert and --grpc-tls-key go together"))
	}
	if o.GRPCTLSClientCA != "" && o.GRPCTLSCert == "" {
		errs = append(errs, errors.New("--grpc-tls-client-ca needs --grpc-tls-cert and --grpc-tls-key"))
	}
	if o.GRPCTLSClientSAN != "" && o.GRPCTLSClientCA == "" {
		errs = append(errs, errors.New("--grpc-tls-client-san needs --grpc-tls-client-ca"))
	}
	if o.XDSBackoffRandomFactor < 0 || o.XDSBackoffRandomFactor > 1 {
		errs = append(errs, errors.New("--xds-backoff-random-factor must be from 0 to 1"))
	}
	if o.XDSBackoffInitial <= 0 || o.XDSBackoffMax < o.XDSBackoffInitial {
		errs = append(errs, errors.New("--xds-backoff-initial must be positive and at most --xds-backoff-max"))
	}
	if o.XDSMaxMessageSize < 0 {
		errs = append(errs, errors.New("--xds-max-message-size must not be negative"))
	}
	if _, err := refenv.ParseHeaders(o.XDSHeaders); err != nil {
		errs = append(errs, fmt.Errorf("--xds-headers: %v", err))
	}
	if !strings.HasPrefix(o.MetricsPath, "/") {
		errs = append(errs, errors.New("--metrics-path must start with /"))
	}
	return errs
}

// xdsTLSConfig builds the TLS settings towards the control plane, or nil
// for plain text.
func xdsTLSConfig(o options) (*tls.Config, error) {
	if !o.XDSTLS && o.XDSTLSCert == "" && o.XDSTLSCA == "" && o.XDSTLSServerName == "" {
		return nil, nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: o.XDSTLSServerName}
	if o.XDSTLSCA != "" {
		pem, err := os.ReadFile(o.XDSTLSCA)
		if err != nil {
			return nil, fmt.Errorf("--xds-tls-ca: %v", err)
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--xds-tls-ca %s: no PEM certificate in it", o.XDSTLSCA)
		}
	}
	if o.XDSTLSCert != "" {
		// Read on every handshake, so a rotated client certificate is used
		// at the next reconnect.
		certFile, keyFile := o.XDSTLSCert, o.XDSTLSKey
		if _, err := tls.LoadX509KeyPair(certFile, keyFile); err != nil {
			return nil, fmt.Errorf("--xds-tls-cert/--xds-tls-key: %v", err)
		}
		c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			cert, err := tls.LoadX509KeyPair(certFile, keyFile)
			if err != nil {
				return nil, err
			}
			return &cert, nil
		}
	}
	return c, nil
}

// xdsNodeMetadata turns --xds-node-metadata into the node's metadata.
func xdsNodeMetadata(s string) *structpb.Struct {
	if s == "" {
		return nil
	}
	fields := map[string]*structpb.Value{}
	for k, v := range refenv.ParseNodeMetadata(s) {
		fields[k] = structpb.NewStringValue(v)
	}
	return &structpb.Struct{Fields: fields}
}
