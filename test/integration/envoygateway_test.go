package integration

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
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/envoyrls/envoy-rls/internal/redistest"
	"github.com/envoyrls/envoy-rls/internal/testutil"
	"github.com/envoyrls/envoy-rls/internal/xdstest"
)

// egPKI is the test's stand-in for Envoy Gateway's certgen: one CA, the
// rate limit server's certificate (Secret envoy-rate-limit, used both to
// serve gRPC and as the xDS client certificate), the control plane's, and
// Envoy's client certificate.
type egPKI struct {
	dir                              string
	ca, rlCert, rlKey, cpCert, cpKey string
	envoyCert, envoyKey              string
	caPool                           *x509.CertPool
	caKey                            *ecdsa.PrivateKey
	caCert                           *x509.Certificate
}

func newEGPKI(t *testing.T) *egPKI {
	t.Helper()
	p := &egPKI{dir: t.TempDir()}
	certs := filepath.Join(p.dir, "certs")
	if err := os.Mkdir(certs, 0o700); err != nil {
		t.Fatal(err)
	}
	p.ca, p.rlCert, p.rlKey = filepath.Join(certs, "ca.crt"), filepath.Join(certs, "tls.crt"), filepath.Join(certs, "tls.key")
	p.cpCert, p.cpKey = filepath.Join(p.dir, "cp.crt"), filepath.Join(p.dir, "cp.key")
	p.envoyCert, p.envoyKey = filepath.Join(p.dir, "envoy.crt"), filepath.Join(p.dir, "envoy.key")
	var err error
	p.caKey, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "envoy-gateway"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, p.caKey.Public(), p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	p.caCert, _ = x509.ParseCertificate(der)
	writePEMFile(t, p.ca, "CERTIFICATE", der)
	p.caPool = x509.NewCertPool()
	p.caPool.AddCert(p.caCert)
	both := []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	p.leaf(t, p.rlCert, p.rlKey, "envoy-ratelimit", both)
	p.leaf(t, p.cpCert, p.cpKey, "envoy-gateway", both)
	p.leaf(t, p.envoyCert, p.envoyKey, "envoy", both)
	return p
}

func (p *egPKI) leaf(t *testing.T, certFile, keyFile, cn string, eku []x509.ExtKeyUsage) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: cn},
		DNSNames: []string{cn, "localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: eku}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.caCert, key.Public(), p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalPKCS8PrivateKey(key)
	writePEMFile(t, certFile, "CERTIFICATE", der)
	writePEMFile(t, keyFile, "PRIVATE KEY", keyDER)
}

func writePEMFile(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// egRateLimitConfig is a RateLimitConfig as Envoy Gateway translates a
// BackendTrafficPolicy rule with a header match and a source CIDR: the
// domain is the listener's name (with '/'), a nested chain with the limit
// on the leaf.
func egRateLimitConfig(domain, rule string, requests uint32) *rlsconf.RateLimitConfig {
	return &rlsconf.RateLimitConfig{
		Name: domain, Domain: domain,
		Descriptors: []*rlsconf.RateLimitDescriptor{{
			Key: rule, Value: rule,
			Descriptors: []*rlsconf.RateLimitDescriptor{{
				Key: "rule-0-match-0",
				Descriptors: []*rlsconf.RateLimitDescriptor{{
					Key: "masked_remote_address", Value: "0.0.0.0/0",
					Descriptors: []*rlsconf.RateLimitDescriptor{{
						Key:       "remote_address",
						RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_HOUR, RequestsPerUnit: requests},
					}},
				}},
			}},
		}},
	}
}

// egRequest is what Envoy sends for that rule.
func egRequest(domain, rule, user, addr string) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*commonv3.RateLimitDescriptor{{Entries: []*commonv3.RateLimitDescriptor_Entry{
		{Key: rule, Value: rule},
		{Key: "rule-0-match-0", Value: user},
		{Key: "masked_remote_address", Value: "0.0.0.0/0"},
		{Key: "remote_address", Value: addr},
	}}}}
}

// egEnvironment is the environment Envoy Gateway gives the rate limit
// Deployment (expectedRateLimitContainerEnv), with paths into the test's
// PKI, the control plane at cpAddr, Redis at redisURL, the listeners on
// loopback at the given ports, and a quick reconnect to the control plane.
func egEnvironment(pki *egPKI, cpAddr, redisURL string, grpcPort, httpPort, debugPort, promPort int) []string {
	return []string{
		"PATH=" + os.Getenv("PATH"),
		// expectedRateLimitContainerEnv, paths into the test's directory
		"RUNTIME_ROOT=/data", "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_IGNOREDOTFILES=true", "RUNTIME_WATCH_ROOT=false",
		"LOG_LEVEL=info", "USE_STATSD=false",
		"CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL=" + cpAddr, "CONFIG_GRPC_XDS_NODE_ID=" + xdstest.NodeID,
		"GRPC_SERVER_USE_TLS=true", "GRPC_SERVER_TLS_CERT=" + pki.rlCert, "GRPC_SERVER_TLS_KEY=" + pki.rlKey, "GRPC_SERVER_TLS_CA_CERT=" + pki.ca,
		"CONFIG_GRPC_XDS_SERVER_USE_TLS=true", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT=" + pki.rlCert, "CONFIG_GRPC_XDS_CLIENT_TLS_KEY=" + pki.rlKey,
		"CONFIG_GRPC_XDS_SERVER_TLS_CACERT=" + pki.ca,
		"FORCE_START_WITHOUT_INITIAL_CONFIG=true",
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + redisURL,
		"USE_PROMETHEUS=true", fmt.Sprintf("PROMETHEUS_ADDR=127.0.0.1:%d", promPort), "PROMETHEUS_MAPPER_YAML=/etc/statsd-exporter/conf.yaml",
		// Listeners on loopback and free ports (reference variables too),
		// and a quick reconnect for a control plane restart.
		"HOST=127.0.0.1", fmt.Sprintf("PORT=%d", httpPort), "GRPC_HOST=127.0.0.1", fmt.Sprintf("GRPC_PORT=%d", grpcPort),
		"DEBUG_HOST=127.0.0.1", fmt.Sprintf("DEBUG_PORT=%d", debugPort),
		"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL=50ms", "XDS_CLIENT_BACKOFF_MAX_INTERVAL=200ms",
	}
}

// TestEnvoyGatewayEndToEnd runs the binary as Envoy Gateway's Deployment
// does: /bin/ratelimit with no arguments and Envoy Gateway's environment,
// its config from a go-control-plane xDS server over mutual TLS 1.3.
func TestEnvoyGatewayEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("process-heavy")
	}
	pki := newEGPKI(t)
	cp := xdstest.Start(t, xdstest.ServerTLS(t, pki.cpCert, pki.cpKey, pki.ca))
	const domain = "default/eg/http"
	const rule = "httproute/default/backend/rule/0/match/0/example"
	cp.Set(t, egRateLimitConfig(domain, rule, 3))
	rdb := redistest.StartStandalone(t)

	clearOfHourEnd(t)
	grpcPort, httpPort, debugPort, promPort := testutil.FreePort(t), testutil.FreePort(t), testutil.FreePort(t), testutil.FreePort(t)
	env := egEnvironment(pki, cp.Addr, rdb.Addr(), grpcPort, httpPort, debugPort, promPort)
	p := &proc{grpcAddr: fmt.Sprintf("127.0.0.1:%d", grpcPort), httpURL: fmt.Sprintf("http://127.0.0.1:%d", httpPort), exited: make(chan struct{})}
	p.cmd = exec.Command(binary) // no arguments, as /bin/ratelimit
	p.cmd.Env = env
	p.cmd.Dir = pki.dir
	startProc(t, p)
	testutil.WaitEvery(t, procPoll, 30*time.Second, "/healthcheck 200", func() bool {
		code, body := httpGetCode(p.httpURL + "/healthcheck")
		return code == 200 && body == "OK"
	})

	envoyCert, err := tls.LoadX509KeyPair(pki.envoyCert, pki.envoyKey)
	if err != nil {
		t.Fatal(err)
	}
	// Envoy Gateway's cluster: TLS with a client certificate, no SNI and
	// no SAN check (the CA is trusted).
	envoyTLS := &tls.Config{RootCAs: pki.caPool, Certificates: []tls.Certificate{envoyCert}, ServerName: "envoy-ratelimit"}
	conn, err := grpc.NewClient(p.grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(envoyTLS)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := rlsv3.NewRateLimitServiceClient(conn)
	codeOf := func(req *rlsv3.RateLimitRequest) (rlsv3.RateLimitResponse_Code, error) {
		resp, err := client.ShouldRateLimit(ctxT(t), req)
		if err != nil {
			return 0, err
		}
		return resp.OverallCode, nil
	}
	testutil.WaitEvery(t, procPoll, 30*time.Second, "the first config over xDS", func() bool {
		_, err := codeOf(egRequest("probe", "x", "y", "z"))
		return err == nil
	})
	cp.WaitRequest(t, "ACK of version 1", xdstest.ACKed("1"))

	// gRPC health under the reference's name, over the same mTLS.
	hr, err := healthpb.NewHealthClient(conn).Check(ctxT(t), &healthpb.HealthCheckRequest{Service: "ratelimit"})
	if err != nil || hr.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health ratelimit: %v %v", hr, err)
	}
	// A client without a certificate is refused.
	noCert, _ := grpc.NewClient(p.grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pki.caPool, ServerName: "envoy-ratelimit"})))
	if _, err := rlsv3.NewRateLimitServiceClient(noCert).ShouldRateLimit(ctxT(t), egRequest(domain, rule, "u", "10.0.0.1")); err == nil {
		t.Fatal("a call without a client certificate was answered")
	}
	noCert.Close()

	// The limit holds exactly: 3 per hour per remote address.
	expect := func(req *rlsv3.RateLimitRequest, want ...rlsv3.RateLimitResponse_Code) {
		t.Helper()
		for i, w := range want {
			got, err := codeOf(req)
			if err != nil || got != w {
				t.Fatalf("call %d for %s: %v %v, want %v", i+1, req.Descriptors[0].Entries[3].Value, got, err, w)
			}
		}
	}
	ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	expect(egRequest(domain, rule, "alice", "10.0.0.1"), ok, ok, ok, over, over)
	expect(egRequest(domain, rule, "alice", "10.0.0.2"), ok, ok, ok, over)

	// /rlconfig on the debug port prints the limit as the reference does.
	_, rl := httpGetCode(fmt.Sprintf("http://127.0.0.1:%d/rlconfig", debugPort))
	wantLine := domain + "." + rule + "_" + rule + ".rule-0-match-0.masked_remote_address_0.0.0.0/0.remote_address: unit=HOUR requests_per_unit=3, shadow_mode: false, quota_mode: false"
	if !strings.Contains(rl, wantLine) {
		t.Fatalf("/rlconfig:\n%s\nwant the line\n%s", rl, wantLine)
	}

	// An updated snapshot applies; the unchanged limit keeps its counters.
	v2 := cp.Set(t, egRateLimitConfig(domain, rule, 3), egRateLimitConfig("default/other", rule, 1))
	cp.WaitRequest(t, "ACK of version "+v2, xdstest.ACKed(v2))
	testutil.WaitEvery(t, procPoll, 10*time.Second, "the second domain", func() bool {
		_, rl := httpGetCode(fmt.Sprintf("http://127.0.0.1:%d/rlconfig", debugPort))
		return strings.Contains(rl, "default/other.")
	})
	expect(egRequest("default/other", rule, "bob", "10.0.0.3"), ok, over)
	expect(egRequest(domain, rule, "alice", "10.0.0.1"), over)

	// An invalid snapshot is NACKed; the last good config keeps serving.
	bad := egRateLimitConfig(domain, rule, 50)
	bad.Descriptors[0].Descriptors[0].Descriptors[0].Descriptors[0].RateLimit.Unit = rlsconf.RateLimitUnit_UNKNOWN
	cp.Set(t, bad)
	nack := cp.WaitRequest(t, "NACK", xdstest.NACKed)
	if !strings.Contains(nack.GetErrorDetail().GetMessage(), "needs a unit") {
		t.Fatalf("NACK reason %q", nack.GetErrorDetail().GetMessage())
	}
	expect(egRequest("default/other", rule, "bob", "10.0.0.4"), ok, over)

	// The control plane goes away and comes back: serving never stops.
	var calls, failures atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				_, err := codeOf(egRequest(domain, rule, "load", fmt.Sprintf("10.1.%d.%d", i, n%250)))
				calls.Add(1)
				if err != nil {
					failures.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
				}
			}
		}(i)
	}
	waitCalls := func(n int64) {
		target := calls.Load() + n
		testutil.WaitEvery(t, procPoll, 30*time.Second, "calls", func() bool { return calls.Load() >= target })
	}
	waitCalls(20)
	cp.Stop()
	testutil.WaitEvery(t, procPoll, 10*time.Second, "the lost control plane in the log", func() bool {
		return strings.Contains(p.Logs(), "xDS stream to the control plane ended")
	})
	waitCalls(50)
	v4 := cp.Set(t, egRateLimitConfig(domain, rule, 3), egRateLimitConfig("default/third", rule, 2))
	cp.Restart(t)
	cp.WaitRequest(t, "ACK of version "+v4, xdstest.ACKed(v4))
	waitCalls(20)
	close(stop)
	wg.Wait()
	if f := failures.Load(); f != 0 {
		t.Fatalf("%d of %d calls failed while the control plane was away; first: %v", f, calls.Load(), firstErr.Load())
	}
	expect(egRequest("default/third", rule, "carol", "10.0.0.5"), ok, ok, over)

	if code, body := httpGetCode(p.httpURL + "/healthcheck"); code != 200 || body != "OK" {
		t.Fatalf("/healthcheck = %d %q", code, body)
	}
	// Prometheus on PROMETHEUS_ADDR.
	code, metrics := httpGetCode(fmt.Sprintf("http://127.0.0.1:%d/metrics", promPort))
	if code != 200 || !strings.Contains(metrics, "go_goroutines") || !strings.Contains(metrics, "process_cpu_seconds_total") {
		t.Fatalf("metrics on PROMETHEUS_ADDR: %d", code)
	}
	// The reference's series under Envoy Gateway's names and labels.
	key1 := rule + "_" + rule
	for _, want := range []string{
		`ratelimit_service_rate_limit_over_limit{domain="` + domain + `",key1="` + key1 + `",key2="rule-0-match-0"} `,
		`ratelimit_service_rate_limit_over_limit{domain="default/other",key1="` + key1 + `",key2="rule-0-match-0"} 2`,
		`ratelimit_service_rate_limit_total_hits{domain="default/other",key1="` + key1 + `",key2="rule-0-match-0"} 4`,
		`ratelimit_service_rate_limit_within_limit{domain="default/third",key1="` + key1 + `",key2="rule-0-match-0"} 2`,
		`ratelimit_service_total_requests{grpc_method="ShouldRateLimit"}`,
		`ratelimit_service_response_time_seconds_count{grpc_method="ShouldRateLimit"}`,
		`ratelimit_service_config_load_success 3`,
		`ratelimit_service_config_load_error 1`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics on PROMETHEUS_ADDR lack %s", want)
		}
	}
	if ec := p.stop(t); ec != 0 {
		t.Fatalf("exit code %d after SIGTERM", ec)
	}
}

// startProc starts p.cmd and collects its log; the process is killed when
// the test ends.
func startProc(t *testing.T, p *proc) {
	t.Helper()
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	p.cmd.Stdout = io.Discard
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := stderr.Read(buf)
			p.mu.Lock()
			p.log.Write(buf[:n])
			p.mu.Unlock()
			if err != nil {
				break
			}
		}
		p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-p.exited
		if t.Failed() {
			t.Logf("envoy-rls log:\n%s", p.Logs())
		}
	})
}

// httpGetCode returns the status code and body of a GET, or 0 on error.
func httpGetCode(url string) (int, string) {
	resp, err := httpClient.Get(url)
	if err != nil {
		return 0, ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
