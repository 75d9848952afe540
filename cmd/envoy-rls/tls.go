package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
)

// redisTLSOn reports whether a --redis-tls-* flag asks for TLS. Any of them
// turns TLS on for every Redis connection: the servers, and the Sentinels
// too with --redis-sentinel.
func (o options) redisTLSOn() bool {
	return o.RedisTLSCAFile != "" || o.RedisTLSCertFile != "" || o.RedisTLSKeyFile != "" ||
		o.RedisTLSServerName != "" || o.RedisTLSInsecureSkipVerify
}

// validateRedisTLS checks the --redis-tls-* flags against each other and
// against --redis-url, without reading any file.
func (o options) validateRedisTLS() []error {
	if !o.redisTLSOn() {
		return nil
	}
	var errs []error
	if (o.RedisTLSCertFile != "") != (o.RedisTLSKeyFile != "") {
		errs = append(errs, errors.New("--redis-tls-cert-file and --redis-tls-key-file go together"))
	}
	if o.RedisTLSInsecureSkipVerify && o.RedisTLSCAFile != "" {
		errs = append(errs, errors.New("--redis-tls-insecure-skip-verify and --redis-tls-ca-file exclude each other (nothing is verified)"))
	}
	if o.RedisURL.set() && !o.RedisURL.tls() {
		// A redis:// URL says plain TCP: rather than silently upgrading it,
		// ask for the scheme that says TLS.
		errs = append(errs, fmt.Errorf("--redis-tls-* flags need a rediss:// --redis-url, got scheme %q", o.RedisURL.url.Scheme))
	}
	return errs
}

// redisTLSConfig builds the TLS configuration of the --redis-tls-* flags,
// reading and checking their files. It returns nil when no such flag is set:
// a rediss:// --redis-url then keeps go-redis's own configuration (system
// roots, the URL's host as server name).
//
// The name verified in a server's certificate is --redis-tls-server-name,
// else the --redis-url host when it has one, else the host each connection
// dials (a Sentinel, the master it names, a Cluster node).
func redisTLSConfig(o options) (*tls.Config, error) {
	if !o.redisTLSOn() {
		return nil, nil
	}
	cfg := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		ServerName:         o.RedisTLSServerName,
		InsecureSkipVerify: o.RedisTLSInsecureSkipVerify,
	}
	if o.RedisURL.set() {
		if cfg.ServerName == "" {
			cfg.ServerName = o.RedisURL.url.Hostname()
		}
		// Keep the URL's skip_verify=true, which go-redis honours too.
		if o.RedisURL.skipVerify {
			cfg.InsecureSkipVerify = true
		}
	}
	if o.RedisTLSCAFile != "" {
		caPEM, err := os.ReadFile(o.RedisTLSCAFile)
		if err != nil {
			return nil, fmt.Errorf("--redis-tls-ca-file: %w", err)
		}
		if cfg.RootCAs, err = certPool(caPEM); err != nil {
			return nil, fmt.Errorf("--redis-tls-ca-file %s: %w", o.RedisTLSCAFile, err)
		}
	}
	if o.RedisTLSCertFile != "" || o.RedisTLSKeyFile != "" {
		if o.RedisTLSCertFile == "" || o.RedisTLSKeyFile == "" {
			return nil, errors.New("--redis-tls-cert-file and --redis-tls-key-file go together")
		}
		certPEM, err := os.ReadFile(o.RedisTLSCertFile)
		if err != nil {
			return nil, fmt.Errorf("--redis-tls-cert-file: %w", err)
		}
		keyPEM, err := os.ReadFile(o.RedisTLSKeyFile)
		if err != nil {
			return nil, fmt.Errorf("--redis-tls-key-file: %w", err)
		}
		cert, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			return nil, fmt.Errorf("--redis-tls-cert-file %s with --redis-tls-key-file %s: %w", o.RedisTLSCertFile, o.RedisTLSKeyFile, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// certPool parses every CERTIFICATE block of a PEM bundle, failing on a
// block that is not a valid certificate and when there is none. Other block
// types are ignored.
func certPool(data []byte) (*x509.CertPool, error) {
	pool := x509.NewCertPool()
	n := 0
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("certificate %d: %w", n+1, err)
		}
		pool.AddCert(c)
		n++
	}
	if n == 0 {
		return nil, errors.New("no PEM certificate found")
	}
	return pool, nil
}
