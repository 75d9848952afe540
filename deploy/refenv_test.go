package deploy_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writeCerts writes a CA and one certificate for localhost signed by it,
// usable as server and client certificate, as Envoy Gateway's Secret
// envoy-rate-limit holds them: tls.crt, tls.key, ca.crt, readable by all.
func writeCerts(t *testing.T, dir string) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "deploy test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "envoy-ratelimit"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		DNSNames: []string{"localhost", "envoy-gateway"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	for name, block := range map[string]*pem.Block{
		"ca.crt":  {Type: "CERTIFICATE", Bytes: caDER},
		"tls.crt": {Type: "CERTIFICATE", Bytes: der},
		"tls.key": {Type: "EC PRIVATE KEY", Bytes: keyDER},
	} {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(block), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestImageUnderEnvoyGateway starts /bin/ratelimit as Envoy Gateway's
// Deployment does: no arguments, uid/gid 65534, read-only root, and exactly
// the environment Envoy Gateway renders (shared/ENVOY-GATEWAY.md §1.1), with
// the paths pointing at test files and, so that tests can run side by side,
// the listeners on free loopback ports (HOST/PORT, GRPC_HOST/GRPC_PORT,
// DEBUG_HOST/DEBUG_PORT; Envoy Gateway leaves them at their defaults). No
// control plane answers (FORCE_START_WITHOUT_INITIAL_CONFIG=true): the
// service must start, report healthy, serve gRPC over mutual TLS and the
// metrics, and write nothing. The xDS exchange itself is tested in
// test/integration.
func TestImageUnderEnvoyGateway(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	root := imageRoot(t)
	certs := worldReadableTempDir(t)
	writeCerts(t, certs)
	redisAddr := startRedis(t)
	httpPort, grpcPort, debugPort, promPort := freePort(t), freePort(t), freePort(t), freePort(t)
	env := []string{
		// Always set by Envoy Gateway.
		"RUNTIME_ROOT=/data", "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_IGNOREDOTFILES=true", "RUNTIME_WATCH_ROOT=false",
		"LOG_LEVEL=info", "USE_STATSD=false",
		"CONFIG_TYPE=GRPC_XDS_SOTW",
		fmt.Sprintf("CONFIG_GRPC_XDS_SERVER_URL=127.0.0.1:%d", freePort(t)), // nothing listens
		"CONFIG_GRPC_XDS_NODE_ID=envoy-ratelimit",
		"GRPC_SERVER_USE_TLS=true",
		"GRPC_SERVER_TLS_CERT=" + certs + "/tls.crt", "GRPC_SERVER_TLS_KEY=" + certs + "/tls.key",
		"GRPC_SERVER_TLS_CA_CERT=" + certs + "/ca.crt",
		"CONFIG_GRPC_XDS_SERVER_USE_TLS=true",
		"CONFIG_GRPC_XDS_CLIENT_TLS_CERT=" + certs + "/tls.crt", "CONFIG_GRPC_XDS_CLIENT_TLS_KEY=" + certs + "/tls.key",
		"CONFIG_GRPC_XDS_SERVER_TLS_CACERT=" + certs + "/ca.crt",
		"FORCE_START_WITHOUT_INITIAL_CONFIG=true",
		// Redis and Prometheus, as Envoy Gateway sets them by default.
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + redisAddr,
		"USE_PROMETHEUS=true", fmt.Sprintf("PROMETHEUS_ADDR=127.0.0.1:%d", promPort),
		"PROMETHEUS_MAPPER_YAML=/etc/statsd-exporter/conf.yaml", // optional ConfigMap: absent here
		// Listeners moved to free loopback ports.
		"HOST=127.0.0.1", fmt.Sprintf("PORT=%d", httpPort),
		"GRPC_HOST=127.0.0.1", fmt.Sprintf("GRPC_PORT=%d", grpcPort),
		"DEBUG_HOST=127.0.0.1", fmt.Sprintf("DEBUG_PORT=%d", debugPort),
	}
	r := runAsImage(t, root, nil, env, certs)
	r.waitHTTP(t, fmt.Sprintf("http://127.0.0.1:%d/healthcheck", httpPort))
	r.checkUser(t)

	// gRPC over mutual TLS with the certificates Envoy Gateway mounts.
	pair, err := tls.LoadX509KeyPair(filepath.Join(certs, "tls.crt"), filepath.Join(certs, "tls.key"))
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(filepath.Join(certs, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 30 * time.Second}, "tcp", fmt.Sprintf("127.0.0.1:%d", grpcPort), &tls.Config{
		Certificates: []tls.Certificate{pair}, RootCAs: pool, ServerName: "localhost", NextProtos: []string{"h2"},
	})
	if err != nil {
		t.Fatalf("TLS handshake with the gRPC port: %v", err)
	}
	if p := conn.ConnectionState().NegotiatedProtocol; p != "h2" {
		t.Errorf("gRPC port negotiated %q, want h2", p)
	}
	conn.Close()
	// Client certificates are required (GRPC_SERVER_TLS_CA_CERT): without
	// one the server ends the connection (in TLS 1.3 the client sees it on
	// its first read).
	bare, err := tls.DialWithDialer(&net.Dialer{Timeout: 30 * time.Second}, "tcp", fmt.Sprintf("127.0.0.1:%d", grpcPort), &tls.Config{
		RootCAs: pool, ServerName: "localhost", NextProtos: []string{"h2"},
	})
	if err == nil {
		bare.SetReadDeadline(time.Now().Add(30 * time.Second))
		_, err = bare.Read(make([]byte, 1))
		bare.Close()
	}
	if err == nil || strings.Contains(err.Error(), "timeout") {
		t.Errorf("a client without a certificate was not refused (err %v)", err)
	}

	// egctl config ratelimit reads /rlconfig on the debug port.
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/rlconfig", debugPort))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("DEBUG_PORT /rlconfig: %d", resp.StatusCode)
	}

	// The Prometheus listener answers with the Go runtime series.
	resp, err = http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", promPort))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "go_goroutines") {
		t.Errorf("PROMETHEUS_ADDR /metrics: %d\n%.500s", resp.StatusCode, body)
	}
	r.stopAndCheckNoWrites(t)
}

// TestImageUnderIstioSample starts /bin/ratelimit as Istio's rate limit
// sample runs the reference: no arguments, the config from a ConfigMap
// mounted at RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config, Redis over TCP; here
// also as uid/gid 65534 from a read-only root. Its limits must apply and it
// must write nothing.
func TestImageUnderIstioSample(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	root := imageRoot(t)
	runtimeRoot := worldReadableTempDir(t)
	if err := os.MkdirAll(filepath.Join(runtimeRoot, "ratelimit"), 0o755); err != nil {
		t.Fatal(err)
	}
	cm := configMapDir(t, map[string]string{"config.yaml": configMapConfig(t)})
	if err := os.Symlink(cm, filepath.Join(runtimeRoot, "ratelimit", "config")); err != nil {
		t.Fatal(err)
	}
	redisAddr := startRedis(t)
	httpPort := freePort(t)
	env := []string{
		"RUNTIME_ROOT=" + runtimeRoot, "RUNTIME_SUBDIRECTORY=ratelimit",
		"RUNTIME_IGNOREDOTFILES=true", "RUNTIME_WATCH_ROOT=false",
		"LOG_LEVEL=debug", "USE_STATSD=false",
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + redisAddr,
		"HOST=127.0.0.1", fmt.Sprintf("PORT=%d", httpPort),
		"GRPC_HOST=127.0.0.1", fmt.Sprintf("GRPC_PORT=%d", freePort(t)),
		"DEBUG_HOST=127.0.0.1", fmt.Sprintf("DEBUG_PORT=%d", freePort(t)),
	}
	r := runAsImage(t, root, nil, env, runtimeRoot, cm)
	httpAddr := fmt.Sprintf("127.0.0.1:%d", httpPort)
	r.waitHTTP(t, "http://"+httpAddr+"/healthcheck")
	r.checkUser(t)
	if !limitFor(t, httpAddr, "ratelimit", []entry{{"PATH", "/productpage"}}) {
		t.Errorf("the ConfigMap's limit for PATH=/productpage did not apply")
	}
	r.stopAndCheckNoWrites(t)
}
