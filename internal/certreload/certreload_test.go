package certreload_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"

	"github.com/envoyrls/envoy-rls/internal/certreload"
	"github.com/envoyrls/envoy-rls/internal/redistest"
	"github.com/envoyrls/envoy-rls/internal/testutil"
)

func read(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// secretDir is a directory laid out as Kubernetes mounts a Secret:
// tls.crt -> ..data/tls.crt, ..data -> ..vN, swapped atomically.
type secretDir struct {
	dir string
	n   int
}

func (s *secretDir) publish(t *testing.T, files map[string][]byte) {
	t.Helper()
	s.n++
	version := filepath.Join(s.dir, "..v"+string(rune('0'+s.n)))
	if err := os.Mkdir(version, 0o700); err != nil {
		t.Fatal(err)
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(version, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tmp := filepath.Join(s.dir, "..data_tmp")
	if err := os.Symlink(filepath.Base(version), tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(s.dir, "..data")); err != nil {
		t.Fatal(err)
	}
	for name := range files {
		link := filepath.Join(s.dir, name)
		if _, err := os.Lstat(link); err != nil {
			if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// A rotation under load: calls on open connections and on new connections
// never fail, new handshakes get the new certificate, and files that do
// not load leave the current certificate serving.
func TestRotationUnderLoad(t *testing.T) {
	a, b := redistest.NewTLSFiles(t), redistest.NewTLSFiles(t)
	caBundle := append(read(t, a.CA), read(t, b.CA)...)
	sd := &secretDir{dir: t.TempDir()}
	sd.publish(t, map[string][]byte{"tls.crt": read(t, a.ServerCert), "tls.key": read(t, a.ServerKey), "ca.crt": caBundle})

	var logs testutil.SyncBuffer
	srv, err := certreload.New(certreload.Options{
		CertFile: filepath.Join(sd.dir, "tls.crt"), KeyFile: filepath.Join(sd.dir, "tls.key"),
		ClientCAFile: filepath.Join(sd.dir, "ca.crt"), CheckInterval: 10 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(grpc.Creds(credentials.NewTLS(srv.Config())))
	healthpb.RegisterHealthServer(gs, health.NewServer())
	lis := listen(t)
	go func() { _ = gs.Serve(lis) }()
	defer gs.Stop()

	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caBundle)
	clientCert, err := tls.LoadX509KeyPair(a.ClientCert, a.ClientKey)
	if err != nil {
		t.Fatal(err)
	}
	clientTLS := &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{clientCert}, ServerName: "localhost"}
	dial := func() *grpc.ClientConn {
		c, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(clientTLS)))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	leafA, leafB := leaf(t, a.ServerCert), leaf(t, b.ServerCert)

	var (
		calls, failures atomic.Int64
		seenB           atomic.Bool
		firstErr        atomic.Value
		stop            = make(chan struct{})
		wg              sync.WaitGroup
	)
	call := func(c *grpc.ClientConn) {
		var p peer.Peer
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := healthpb.NewHealthClient(c).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Peer(&p))
		calls.Add(1)
		if err != nil {
			failures.Add(1)
			firstErr.CompareAndSwap(nil, err.Error())
			return
		}
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.PeerCertificates) > 0 &&
			bytes.Equal(ti.State.PeerCertificates[0].Raw, leafB.Raw) {
			seenB.Store(true)
		}
	}
	for i := 0; i < 4; i++ {
		wg.Add(2)
		go func() { // one long-lived connection
			defer wg.Done()
			c := dial()
			defer c.Close()
			for {
				select {
				case <-stop:
					return
				default:
					call(c)
				}
			}
		}()
		go func() { // a new connection, so a new handshake, per call
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
					c := dial()
					call(c)
					c.Close()
				}
			}
		}()
	}
	waitCalls := func(n int64) {
		target := calls.Load() + n
		for calls.Load() < target {
			time.Sleep(time.Millisecond)
		}
	}
	waitCalls(200)
	if got := srv.Certificate().Leaf; got == nil || !bytes.Equal(got.Raw, leafA.Raw) {
		t.Fatal("the server does not start with the first certificate")
	}
	sd.publish(t, map[string][]byte{"tls.crt": read(t, b.ServerCert), "tls.key": read(t, b.ServerKey), "ca.crt": caBundle})
	deadline := time.Now().Add(60 * time.Second)
	for !seenB.Load() {
		if time.Now().After(deadline) {
			t.Fatal("no handshake got the new certificate within 30s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	waitCalls(200)
	// A broken set (the new certificate with the old key) keeps B serving.
	sd.publish(t, map[string][]byte{"tls.crt": read(t, a.ServerCert), "tls.key": read(t, b.ServerKey), "ca.crt": caBundle})
	for !bytes.Contains(logs.Bytes(), []byte("do not load")) {
		if time.Now().After(deadline) {
			t.Fatal("the broken set was not noticed within 30s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	waitCalls(200)
	close(stop)
	wg.Wait()
	if f := failures.Load(); f != 0 {
		t.Fatalf("%d of %d calls failed during rotation; first: %v", f, calls.Load(), firstErr.Load())
	}
	if got := srv.Certificate().Leaf; !bytes.Equal(got.Raw, leafB.Raw) {
		t.Fatal("a set that does not load replaced the certificate")
	}
	t.Logf("%d calls, none failed", calls.Load())
}

func TestClientVerification(t *testing.T) {
	a, other := redistest.NewTLSFiles(t), redistest.NewTLSFiles(t)
	for _, tc := range []struct {
		name      string
		san       string
		client    redistest.TLSFiles
		noCert    bool
		wantError bool
	}{
		{name: "signed client", client: a},
		{name: "no client certificate", client: a, noCert: true, wantError: true},
		{name: "client of another CA", client: other, wantError: true},
		{name: "SAN required and absent", san: "envoy.example", client: a, wantError: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, err := certreload.New(certreload.Options{CertFile: a.ServerCert, KeyFile: a.ServerKey, ClientCAFile: a.CA, ClientSAN: tc.san,
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err != nil {
				t.Fatal(err)
			}
			lis, err := tls.Listen("tcp", "127.0.0.1:0", srv.Config())
			if err != nil {
				t.Fatal(err)
			}
			defer lis.Close()
			errc := make(chan error, 1)
			go func() {
				c, err := lis.Accept()
				if err == nil {
					err = c.(*tls.Conn).Handshake()
					c.Close()
				}
				errc <- err
			}()
			roots := x509.NewCertPool()
			roots.AppendCertsFromPEM(read(t, a.CA))
			cfg := &tls.Config{RootCAs: roots, ServerName: "localhost"}
			if !tc.noCert {
				cc, err := tls.LoadX509KeyPair(tc.client.ClientCert, tc.client.ClientKey)
				if err != nil {
					t.Fatal(err)
				}
				cfg.Certificates = []tls.Certificate{cc}
			}
			c, err := tls.Dial("tcp", lis.Addr().String(), cfg)
			if err == nil {
				c.Close()
			}
			if serr := <-errc; (serr != nil) != tc.wantError {
				t.Fatalf("server handshake error %v, want error %v", serr, tc.wantError)
			}
		})
	}
}

func TestNewNamesTheBadFile(t *testing.T) {
	a := redistest.NewTLSFiles(t)
	bad := filepath.Join(t.TempDir(), "bad.pem")
	if err := os.WriteFile(bad, []byte("not a pem"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, o := range []certreload.Options{
		{CertFile: bad, KeyFile: a.ServerKey},
		{CertFile: a.ServerCert, KeyFile: a.ServerKey, ClientCAFile: bad},
		{CertFile: a.ServerCert, KeyFile: filepath.Join(t.TempDir(), "missing.pem")},
	} {
		_, err := certreload.New(o)
		if err == nil {
			t.Fatalf("%+v accepted", o)
		}
		if !bytes.Contains([]byte(err.Error()), []byte(filepath.Base(bad))) && !bytes.Contains([]byte(err.Error()), []byte("missing.pem")) {
			t.Fatalf("error %q does not name the file", err)
		}
	}
}

func listen(t *testing.T) net.Listener {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return lis
}

func leaf(t *testing.T, certFile string) *x509.Certificate {
	t.Helper()
	c, err := tls.LoadX509KeyPair(certFile, certFile)
	if err == nil && c.Leaf != nil {
		return c.Leaf
	}
	block, _ := pem.Decode(read(t, certFile))
	x, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return x
}
