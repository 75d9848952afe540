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
func (c redisConn) redisTLSOn() bool {
	return c.RedisTLSCAFile != "" || c.RedisTLSCertFile != "" || c.RedisTLSKeyFile != "" ||
		c.RedisTLSServerName != "" || c.RedisTLSInsecureSkipVerify
}

// validateRedisTLS checks the --redis-tls-* flags against each other and
// against --redis-url, without reading any file.
func (c redisConn) validateRedisTLS() []error {
	if !c.redisTLSOn() {
		return nil
	}
	var errs []error
	if (c.RedisTLSCertFile != "") != (c.RedisTLSKeyFile != "") {
		errs = append(errs, fmt.Errorf("%s and %s go together", c.flag("tls-cert-file"), c.flag("tls-key-file")))
	}
	if c.RedisTLSInsecureSkipVerify && c.RedisTLSCAFile != "" {
		errs = append(errs, fmt.Errorf("%s and %s exclude each other (nothing is verified)", c.flag("tls-insecure-skip-verify"), c.flag("tls-ca-file")))
	}
	if c.RedisURL.set() && !c.RedisURL.tls() {
		// A redis:// URL says plain TCP: rather than silently upgrading it,
		// ask for the scheme that says TLS.
		errs = append(errs, fmt.Errorf("%s flags need a rediss:// %s, got scheme %q", c.flag("tls-*"), c.flag("url"), c.RedisURL.url.Scheme))
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
func redisTLSConfig(c redisConn) (*tls.Config, error) {
	if !c.redisTLSOn() {
		return nil, nil
	}
	cfg := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		ServerName:         c.RedisTLSServerName,
		InsecureSkipVerify: c.RedisTLSInsecureSkipVerify,
	}
	if c.RedisURL.set() {
		if cfg.ServerName == "" {
			cfg.ServerName = c.RedisURL.url.Hostname()
		}
		// Keep the URL's skip_verify=true, which go-redis honours too.
		if c.RedisURL.skipVerify {
			cfg.InsecureSkipVerify = true
		}
	}
	if c.RedisTLSCAFile != "" {
		caPEM, err := os.ReadFile(c.RedisTLSCAFile)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", c.flag("tls-ca-file"), err)
		}
		if cfg.RootCAs, err = certPool(caPEM); err != nil {
			return nil, fmt.Errorf("%s %s: %w", c.flag("tls-ca-file"), c.RedisTLSCAFile, err)
		}
	}
	if c.RedisTLSCertFile != "" || c.RedisTLSKeyFile != "" {
		if c.RedisTLSCertFile == "" || c.RedisTLSKeyFile == "" {
			return nil, fmt.Errorf("%s and %s go together", c.flag("tls-cert-file"), c.flag("tls-key-file"))
		}
		certPEM, err := os.ReadFile(c.RedisTLSCertFile)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", c.flag("tls-cert-file"), err)
		}
		keyPEM, err := os.ReadFile(c.RedisTLSKeyFile)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", c.flag("tls-key-file"), err)
		}
		cert, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			return nil, fmt.Errorf("%s %s with %s %s: %w", c.flag("tls-cert-file"), c.RedisTLSCertFile, c.flag("tls-key-file"), c.RedisTLSKeyFile, err)
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
