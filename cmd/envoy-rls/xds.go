package main

// The xDS client of --config-xds.

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/envoyrls/envoy-rls/internal/refenv"
	"github.com/envoyrls/envoy-rls/pkg/descriptors"
	"github.com/envoyrls/envoy-rls/pkg/xdsconfig"
)

// xdsOptions say how to reach the control plane of --config-xds.
type xdsOptions struct {
	NodeID         string
	NodeMetadata   string
	Headers        string
	TLS            bool
	TLSCert        string
	TLSKey         string
	TLSCA          string
	TLSServerName  string
	Backoff        xdsconfig.Backoff
	MaxMessageSize int
}

func (o *xdsOptions) addFlags(fs *flagSet) {
	fs.StringVar(&o.NodeID, "xds-node-id", "envoy-ratelimit", "node id sent to the xDS control plane (Envoy Gateway serves envoy-ratelimit)")
	fs.StringVar(&o.NodeMetadata, "xds-node-metadata", "", "node metadata sent to the control plane: key=value[,key=value...]")
	fs.StringVar(&o.Headers, "xds-headers", "", "gRPC metadata added to the xDS stream: key:value[,key:value...]")
	fs.BoolVar(&o.TLS, "xds-tls", false, "connect to the control plane with TLS (implied by the other --xds-tls-* flags)")
	fs.StringVar(&o.TLSCert, "xds-tls-cert", "", "PEM client certificate presented to the control plane (mutual TLS), with --xds-tls-key")
	fs.StringVar(&o.TLSKey, "xds-tls-key", "", "PEM private key of --xds-tls-cert")
	fs.StringVar(&o.TLSCA, "xds-tls-ca", "", "PEM CA bundle that verifies the control plane instead of the system roots")
	fs.StringVar(&o.TLSServerName, "xds-tls-server-name", "", "name verified in the control plane's certificate (default: the --config-xds host)")
	fs.DurationVar(&o.Backoff.Initial, "xds-backoff-initial", xdsconfig.DefaultBackoff.Initial, "first wait before reconnecting to the control plane; it doubles per failure")
	fs.DurationVar(&o.Backoff.Max, "xds-backoff-max", xdsconfig.DefaultBackoff.Max, "longest wait before reconnecting to the control plane")
	fs.Float64Var(&o.Backoff.RandomFactor, "xds-backoff-random-factor", xdsconfig.DefaultBackoff.RandomFactor, "spread of each reconnect wait, 0 to 1 (with --xds-backoff-jitter)")
	fs.BoolVar(&o.Backoff.Jitter, "xds-backoff-jitter", xdsconfig.DefaultBackoff.Jitter, "randomize reconnect waits by --xds-backoff-random-factor")
	fs.IntVar(&o.MaxMessageSize, "xds-max-message-size", 0, "largest xDS response accepted, in bytes (0: gRPC's 4 MiB)")
}

// validate checks the settings without reading any file (whether or not
// --config-xds is given).
func (o xdsOptions) validate() []error {
	var errs []error
	if (o.TLSCert == "") != (o.TLSKey == "") {
		errs = append(errs, errors.New("--xds-tls-cert and --xds-tls-key go together"))
	}
	if o.Backoff.RandomFactor < 0 || o.Backoff.RandomFactor > 1 {
		errs = append(errs, errors.New("--xds-backoff-random-factor must be from 0 to 1"))
	}
	if o.Backoff.Initial <= 0 || o.Backoff.Max < o.Backoff.Initial {
		errs = append(errs, errors.New("--xds-backoff-initial must be positive and at most --xds-backoff-max"))
	}
	if o.MaxMessageSize < 0 {
		errs = append(errs, errors.New("--xds-max-message-size must not be negative"))
	}
	if _, err := refenv.ParseHeaders(o.Headers); err != nil {
		errs = append(errs, fmt.Errorf("--xds-headers: %v", err))
	}
	return errs
}

// newXDSClient builds the client of the control plane at addr, reading
// configs as lo says. It hands every valid config to apply and tells
// loaded the outcome of every response.
func (o xdsOptions) newClient(addr string, lo loadOptions, apply func(*descriptors.Config), loaded func(error), log *slog.Logger) (*xdsconfig.Client, error) {
	tlsConf, err := o.tlsConfig()
	if err != nil {
		return nil, err
	}
	headers, _ := refenv.ParseHeaders(o.Headers) // validated
	return xdsconfig.New(xdsconfig.Options{
		Addr:           addr,
		NodeID:         o.NodeID,
		NodeMetadata:   nodeMetadata(o.NodeMetadata),
		TLS:            tlsConf,
		Headers:        headers,
		MaxMessageSize: o.MaxMessageSize,
		Backoff:        o.Backoff,
		MergeDomains:   lo.MergeDomainConfig,
		Lenient:        lo.ConfigLenient,
		OrderFree:      lo.RLQS,
		Apply:          apply,
		Loaded:         loaded,
		Logger:         log,
	})
}

// tlsConfig builds the TLS settings towards the control plane, or nil for
// plain text.
func (o xdsOptions) tlsConfig() (*tls.Config, error) {
	if !o.TLS && o.TLSCert == "" && o.TLSCA == "" && o.TLSServerName == "" {
		return nil, nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: o.TLSServerName}
	if o.TLSCA != "" {
		pem, err := os.ReadFile(o.TLSCA)
		if err != nil {
			return nil, fmt.Errorf("--xds-tls-ca: %v", err)
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--xds-tls-ca %s: no PEM certificate in it", o.TLSCA)
		}
	}
	if o.TLSCert != "" {
		// Read on every handshake, so a rotated client certificate is used
		// at the next reconnect.
		certFile, keyFile := o.TLSCert, o.TLSKey
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

// nodeMetadata turns --xds-node-metadata into the node's metadata.
func nodeMetadata(s string) *structpb.Struct {
	if s == "" {
		return nil
	}
	fields := map[string]*structpb.Value{}
	for k, v := range refenv.ParseNodeMetadata(s) {
		fields[k] = structpb.NewStringValue(v)
	}
	return &structpb.Struct{Fields: fields}
}
