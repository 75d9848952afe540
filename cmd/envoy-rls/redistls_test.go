package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/envoyrls/envoy-rls/internal/redistest"
	"github.com/envoyrls/envoy-rls/internal/testutil"
)

func TestRedisTLSFlagsFromEnvironment(t *testing.T) {
	t.Setenv("ENVOY_RLS_REDIS_TLS_CA_FILE", "/etc/ca.pem")
	t.Setenv("ENVOY_RLS_REDIS_TLS_CERT_FILE", "/etc/c.pem")
	t.Setenv("ENVOY_RLS_REDIS_TLS_KEY_FILE", "/etc/k.pem")
	t.Setenv("ENVOY_RLS_REDIS_TLS_SERVER_NAME", "redis.internal")
	o, err := parseServe([]string{"--config", "x", "--backend", "redis", "--redis-cluster", "a:1"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.Redis.Main.RedisTLSCAFile != "/etc/ca.pem" || o.Redis.Main.RedisTLSCertFile != "/etc/c.pem" || o.Redis.Main.RedisTLSKeyFile != "/etc/k.pem" ||
		o.Redis.Main.RedisTLSServerName != "redis.internal" || o.Redis.Main.RedisTLSInsecureSkipVerify {
		t.Fatalf("environment not applied: %+v", o)
	}
	if !o.Redis.Main.redisTLSOn() {
		t.Fatal("TLS flags set but TLS off")
	}

	t.Setenv("ENVOY_RLS_REDIS_TLS_CA_FILE", "")
	t.Setenv("ENVOY_RLS_REDIS_TLS_INSECURE_SKIP_VERIFY", "true")
	if o, err = parseServe([]string{"--config", "x", "--backend", "redis", "--redis-cluster", "a:1"}, io.Discard); err != nil {
		t.Fatal(err)
	}
	if !o.Redis.Main.RedisTLSInsecureSkipVerify {
		t.Fatal("ENVOY_RLS_REDIS_TLS_INSECURE_SKIP_VERIFY not applied")
	}
}

func TestRedisTLSFlagValidation(t *testing.T) {
	base := []string{"--config", "x", "--backend", "redis"}
	for _, tc := range []struct {
		args []string
		want string // empty: valid
	}{
		{[]string{"--redis-url", "rediss://h:1", "--redis-tls-cert-file", "c.pem"}, "--redis-tls-cert-file and --redis-tls-key-file go together"},
		{[]string{"--redis-url", "rediss://h:1", "--redis-tls-key-file", "k.pem"}, "--redis-tls-cert-file and --redis-tls-key-file go together"},
		{[]string{"--redis-url", "redis://h:1", "--redis-tls-ca-file", "ca.pem"}, "need a rediss:// --redis-url"},
		{[]string{"--redis-url", "unix:///run/redis.sock", "--redis-tls-server-name", "x"}, "need a rediss:// --redis-url"},
		{[]string{"--redis-cluster", "a:1", "--redis-url", "redis://:pw@/", "--redis-tls-ca-file", "ca.pem"}, "need a rediss:// --redis-url"},
		{[]string{"--redis-url", "rediss://h:1", "--redis-tls-ca-file", "ca.pem", "--redis-tls-insecure-skip-verify"}, "exclude each other"},
		{[]string{"--redis-url", "rediss://h:1", "--redis-tls-ca-file", "ca.pem", "--redis-tls-cert-file", "c.pem", "--redis-tls-key-file", "k.pem"}, ""},
		{[]string{"--redis-url", "REDISS://h:1", "--redis-tls-server-name", "n"}, ""},
		{[]string{"--redis-cluster", "a:1", "--redis-tls-ca-file", "ca.pem"}, ""},
		{[]string{"--redis-sentinel", "a:1", "--redis-sentinel-master", "m", "--redis-tls-insecure-skip-verify"}, ""},
		// Without a TLS flag a redis:// URL is plain, as before.
		{[]string{"--redis-url", "redis://h:1"}, ""},
	} {
		_, err := parseServe(append(append([]string{}, base...), tc.args...), io.Discard)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%v: %v, want valid", tc.args, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%v: got %v, want an error containing %q", tc.args, err, tc.want)
		}
	}
}

func TestRedisTLSConfigFileErrorsNameTheFlag(t *testing.T) {
	files := redistest.NewTLSFiles(t)
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	missing := filepath.Join(dir, "missing.pem")
	notPEM := write("not.pem", "this is not PEM\n")
	badCert := write("bad-cert.pem", "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
	unreadable := write("unreadable.pem", "x")
	if err := os.Chmod(unreadable, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := os.ReadFile(unreadable); err == nil {
		unreadable = missing // running as root: mode 0 does not stop reading
	}
	url := "rediss://127.0.0.1:1/0"
	for _, tc := range []struct {
		name string
		o    redisConn
		want []string
	}{
		{"missing CA", redisConn{RedisURL: mustRedisURL(url), RedisTLSCAFile: missing}, []string{"--redis-tls-ca-file", missing}},
		{"unreadable CA", redisConn{RedisURL: mustRedisURL(url), RedisTLSCAFile: unreadable}, []string{"--redis-tls-ca-file", unreadable}},
		{"CA not PEM", redisConn{RedisURL: mustRedisURL(url), RedisTLSCAFile: notPEM}, []string{"--redis-tls-ca-file", notPEM, "no PEM certificate"}},
		{"CA is a key", redisConn{RedisURL: mustRedisURL(url), RedisTLSCAFile: files.ClientKey}, []string{"--redis-tls-ca-file", "no PEM certificate"}},
		{"CA block not a certificate", redisConn{RedisURL: mustRedisURL(url), RedisTLSCAFile: badCert}, []string{"--redis-tls-ca-file", badCert, "certificate 1"}},
		{"missing cert", redisConn{RedisURL: mustRedisURL(url), RedisTLSCertFile: missing, RedisTLSKeyFile: files.ClientKey}, []string{"--redis-tls-cert-file", missing}},
		{"missing key", redisConn{RedisURL: mustRedisURL(url), RedisTLSCertFile: files.ClientCert, RedisTLSKeyFile: missing}, []string{"--redis-tls-key-file", missing}},
		{"cert not PEM", redisConn{RedisURL: mustRedisURL(url), RedisTLSCertFile: notPEM, RedisTLSKeyFile: files.ClientKey}, []string{"--redis-tls-cert-file", "--redis-tls-key-file", notPEM}},
		{"key of another cert", redisConn{RedisURL: mustRedisURL(url), RedisTLSCertFile: files.ClientCert, RedisTLSKeyFile: files.ServerKey}, []string{"--redis-tls-cert-file", "--redis-tls-key-file", "does not match"}},
		{"cert without key", redisConn{RedisURL: mustRedisURL(url), RedisTLSCertFile: files.ClientCert}, []string{"--redis-tls-cert-file and --redis-tls-key-file go together"}},
	} {
		cfg, err := redisTLSConfig(tc.o)
		if err == nil {
			t.Errorf("%s: no error (config %v)", tc.name, cfg != nil)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not contain %q", tc.name, err, w)
			}
		}
	}
	if cfg, err := redisTLSConfig(redisConn{RedisURL: mustRedisURL(url)}); cfg != nil || err != nil {
		t.Errorf("no TLS flag: got %v, %v; want nil, nil (a rediss:// URL keeps go-redis's own)", cfg, err)
	}
}

// TestStartupFailsOnBadTLSFile: `serve` exits 1 before listening, with a
// message that names the flag.
func TestStartupFailsOnBadTLSFile(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "limits.yaml")
	if err := os.WriteFile(cfg, []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(t.TempDir(), "ca.pem")
	var stderr bytes.Buffer
	code := run([]string{"serve", "--config", cfg, "--grpc-addr", testutil.FreeAddr(t), "--http-addr", "", "--log-level", "error",
		"--backend", "redis", "--redis-url", "rediss://127.0.0.1:1/0", "--redis-tls-ca-file", missing}, io.Discard, &stderr)
	if code != 1 || !strings.Contains(stderr.String(), "--redis-tls-ca-file") || !strings.Contains(stderr.String(), missing) {
		t.Fatalf("exit %d, stderr %q; want 1 and a message naming --redis-tls-ca-file and the path", code, stderr.String())
	}
	stderr.Reset()
	code = run([]string{"serve", "--config", cfg, "--backend", "redis", "--redis-url", "rediss://127.0.0.1:1/0",
		"--redis-tls-key-file", missing}, io.Discard, &stderr)
	if code != 2 || !strings.Contains(stderr.String(), "go together") {
		t.Fatalf("key without cert: exit %d, stderr %q; want 2 and 'go together'", code, stderr.String())
	}
}

// tlsPeer is a TLS server on a loopback port that requires a client
// certificate signed by the test CA; each accepted connection's handshake
// result goes to results.
type tlsPeer struct {
	addr    string
	results chan error
}

func startTLSPeer(t *testing.T, files redistest.TLSFiles) *tlsPeer {
	t.Helper()
	cert, err := tls.LoadX509KeyPair(files.ServerCert, files.ServerKey)
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(files.CA)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	l, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    pool,
		MinVersion:   tls.VersionTLS12,
	})
	if err != nil {
		t.Fatal(err)
	}
	p := &tlsPeer{addr: l.Addr().String(), results: make(chan error, 16)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			tc := c.(*tls.Conn)
			_ = tc.SetDeadline(time.Now().Add(5 * time.Second))
			err = tc.Handshake()
			if err == nil {
				state := tc.ConnectionState()
				if len(state.PeerCertificates) == 0 || state.PeerCertificates[0].Subject.CommonName != "redistest client" {
					err = errors.New("no client certificate")
				} else {
					_, err = tc.Write([]byte("ok"))
				}
			}
			p.results <- err
			tc.Close()
		}
	}()
	t.Cleanup(func() { l.Close(); <-done })
	return p
}

// dial makes one TLS connection to the peer with cfg and returns the
// client's and the server's handshake errors.
func (p *tlsPeer) dial(t *testing.T, cfg *tls.Config) (client, server error) {
	t.Helper()
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", p.addr, cfg)
	if err == nil {
		// With TLS 1.3 the client learns that the server refused its
		// certificate only when it reads.
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 2)
		_, err = io.ReadFull(conn, buf)
		conn.Close()
	}
	select {
	case server = <-p.results:
	case <-time.After(5 * time.Second):
		// The client gave up before the server finished: the client's
		// error says why.
		server = errors.New("no handshake on the server")
	}
	return err, server
}

// TestRedisTLSConfigHandshake runs real TLS handshakes with the built
// configurations against a server that requires client certificates.
func TestRedisTLSConfigHandshake(t *testing.T) {
	files := redistest.NewTLSFiles(t)
	peer := startTLSPeer(t, files)
	url := "rediss://" + peer.addr + "/0"
	build := func(o redisConn) *tls.Config {
		t.Helper()
		cfg, err := redisTLSConfig(o)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.MinVersion != tls.VersionTLS12 {
			t.Fatalf("MinVersion %x, want TLS 1.2", cfg.MinVersion)
		}
		return cfg
	}
	mtls := redisConn{RedisURL: mustRedisURL(url), RedisTLSCAFile: files.CA, RedisTLSCertFile: files.ClientCert, RedisTLSKeyFile: files.ClientKey}

	// Private CA and client certificate: accepted both ways; the server
	// name is the URL's host, an IP address in the certificate.
	cfg := build(mtls)
	if cfg.ServerName != "127.0.0.1" {
		t.Errorf("ServerName %q, want the URL's host 127.0.0.1", cfg.ServerName)
	}
	if c, s := peer.dial(t, cfg); c != nil || s != nil {
		t.Fatalf("mTLS with the private CA: client %v, server %v", c, s)
	}

	// Sentinel or Cluster without a URL: each connection verifies the host
	// it dials.
	noURL := mtls
	noURL.RedisURL = redisURLFlag{}
	noURL.RedisCluster = addrList{peer.addr}
	if cfg := build(noURL); cfg.ServerName != "" {
		t.Errorf("no URL: ServerName %q, want empty (the dialed host)", cfg.ServerName)
	} else if c, s := peer.dial(t, cfg); c != nil || s != nil {
		t.Fatalf("no URL: client %v, server %v", c, s)
	}

	// --redis-tls-server-name replaces the name verified: localhost is in
	// the certificate, another name is not.
	named := mtls
	named.RedisTLSServerName = "localhost"
	if c, s := peer.dial(t, build(named)); c != nil || s != nil {
		t.Fatalf("server name localhost: client %v, server %v", c, s)
	}
	named.RedisTLSServerName = "redis.example.com"
	var hostErr x509.HostnameError
	if c, _ := peer.dial(t, build(named)); !errors.As(c, &hostErr) {
		t.Fatalf("server name not in the certificate: client error %v, want a hostname error", c)
	}

	// Without --redis-tls-ca-file the system roots do not know the CA.
	sysRoots := mtls
	sysRoots.RedisTLSCAFile = ""
	var authErr x509.UnknownAuthorityError
	if c, _ := peer.dial(t, build(sysRoots)); !errors.As(c, &authErr) {
		t.Fatalf("system roots: client error %v, want unknown authority", c)
	}

	// --redis-tls-insecure-skip-verify accepts the unknown CA.
	skip := sysRoots
	skip.RedisTLSInsecureSkipVerify = true
	if c, s := peer.dial(t, build(skip)); c != nil || s != nil {
		t.Fatalf("skip verify: client %v, server %v", c, s)
	}
	// So does the URL's skip_verify=true, which go-redis honours too.
	skipURL := sysRoots
	skipURL.RedisURL = mustRedisURL(url + "?skip_verify=true")
	if c, s := peer.dial(t, build(skipURL)); c != nil || s != nil {
		t.Fatalf("skip_verify in the URL: client %v, server %v", c, s)
	}

	// Without the client certificate the server refuses the connection.
	noCert := mtls
	noCert.RedisTLSCertFile, noCert.RedisTLSKeyFile = "", ""
	if c, s := peer.dial(t, build(noCert)); c == nil || s == nil {
		t.Fatalf("no client certificate: client %v, server %v; want both to fail", c, s)
	}
}
