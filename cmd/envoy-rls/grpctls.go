package main

// TLS of the gRPC server.

import (
	"errors"
	"fmt"
	"log/slog"

	"google.golang.org/grpc/credentials"

	"github.com/envoyrls/envoy-rls/internal/certreload"
)

// grpcTLSOptions are the gRPC server's certificate and what it requires of
// clients.
type grpcTLSOptions struct {
	Cert, Key string
	ClientCA  string
	ClientSAN string
}

func (o *grpcTLSOptions) addFlags(fs *flagSet) {
	fs.StringVar(&o.Cert, "grpc-tls-cert", "", "PEM certificate of the gRPC server (TLS), with --grpc-tls-key; re-read when the file changes")
	fs.StringVar(&o.Key, "grpc-tls-key", "", "PEM private key of --grpc-tls-cert")
	fs.StringVar(&o.ClientCA, "grpc-tls-client-ca", "", "PEM CA bundle: require gRPC clients to present a certificate it signed (mutual TLS)")
	fs.StringVar(&o.ClientSAN, "grpc-tls-client-san", "", "with --grpc-tls-client-ca: require this DNS name or IP in the client certificate")
}

// on reports whether the gRPC server speaks TLS.
func (o grpcTLSOptions) on() bool { return o.Cert != "" }

func (o grpcTLSOptions) validate() []error {
	var errs []error
	if (o.Cert == "") != (o.Key == "") {
		errs = append(errs, errors.New("--grpc-tls-cert and --grpc-tls-key go together"))
	}
	if o.ClientCA != "" && o.Cert == "" {
		errs = append(errs, errors.New("--grpc-tls-client-ca needs --grpc-tls-cert and --grpc-tls-key"))
	}
	if o.ClientSAN != "" && o.ClientCA == "" {
		errs = append(errs, errors.New("--grpc-tls-client-san needs --grpc-tls-client-ca"))
	}
	return errs
}

// credentials returns the gRPC server's TLS credentials; the files are
// re-read when they change.
func (o grpcTLSOptions) credentials(log *slog.Logger) (credentials.TransportCredentials, error) {
	srv, err := certreload.New(certreload.Options{
		CertFile: o.Cert, KeyFile: o.Key,
		ClientCAFile: o.ClientCA, ClientSAN: o.ClientSAN,
		Logger: log,
	})
	if err != nil {
		return nil, fmt.Errorf("--grpc-tls-cert/--grpc-tls-key/--grpc-tls-client-ca: %v", err)
	}
	return credentials.NewTLS(srv.Config()), nil
}
