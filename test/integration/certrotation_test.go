package integration

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/envoyrls/envoy-rls/internal/redistest"
	"github.com/envoyrls/envoy-rls/internal/testutil"
)

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestGRPCCertificateRotationUnderLoad replaces the gRPC server's
// certificate files the way Kubernetes updates a mounted Secret (an atomic
// ..data symlink swap) while clients call on open connections and on new
// ones: no call fails, and new connections get the new certificate.
func TestGRPCCertificateRotationUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("process-heavy")
	}
	a, b := redistest.NewTLSFiles(t), redistest.NewTLSFiles(t)
	secret := &configMapDir{dir: filepath.Join(t.TempDir(), "certs")}
	secret.publish(t, map[string]string{"tls.crt": string(readFile(t, a.ServerCert)), "tls.key": string(readFile(t, a.ServerKey))})
	p := startServe(t, nil, "--config", repoFile("examples", "ratelimit.yaml"),
		"--grpc-tls-cert", filepath.Join(secret.dir, "tls.crt"), "--grpc-tls-key", filepath.Join(secret.dir, "tls.key"))

	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(readFile(t, a.CA))
	roots.AppendCertsFromPEM(readFile(t, b.CA))
	clientTLS := &tls.Config{RootCAs: roots, ServerName: "localhost"}
	block, _ := pem.Decode(readFile(t, b.ServerCert))
	newLeaf := block.Bytes
	dial := func() *grpc.ClientConn {
		c, err := grpc.NewClient(p.grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(clientTLS)))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	req := &rlsv3.RateLimitRequest{Domain: "example", Descriptors: []*commonv3.RateLimitDescriptor{descriptor("unconfigured", "x")}}
	var (
		calls, failures atomic.Int64
		sawNew          atomic.Bool
		firstErr        atomic.Value
		stop            = make(chan struct{})
		wg              sync.WaitGroup
	)
	call := func(c *grpc.ClientConn) {
		var pr peer.Peer
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := rlsv3.NewRateLimitServiceClient(c).ShouldRateLimit(ctx, req, grpc.Peer(&pr))
		calls.Add(1)
		if err != nil {
			failures.Add(1)
			firstErr.CompareAndSwap(nil, err.Error())
			return
		}
		if ti, ok := pr.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.PeerCertificates) > 0 && bytes.Equal(ti.State.PeerCertificates[0].Raw, newLeaf) {
			sawNew.Store(true)
		}
	}
	for i := 0; i < 3; i++ {
		wg.Add(2)
		go func() {
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
		go func() {
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
		testutil.WaitEvery(t, procPoll, 60*time.Second, "calls", func() bool { return calls.Load() >= target })
	}
	waitCalls(100)
	secret.publish(t, map[string]string{"tls.crt": string(readFile(t, b.ServerCert)), "tls.key": string(readFile(t, b.ServerKey))})
	testutil.WaitEvery(t, procPoll, 60*time.Second, "a handshake with the new certificate", sawNew.Load)
	waitCalls(100)
	close(stop)
	wg.Wait()
	if f := failures.Load(); f != 0 {
		t.Fatalf("%d of %d calls failed across the rotation; first: %v", f, calls.Load(), firstErr.Load())
	}
	t.Logf("%d calls across the rotation, none failed", calls.Load())
}
