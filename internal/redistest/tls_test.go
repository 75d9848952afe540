package redistest

import (
	"context"
	"crypto/tls"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestTLSServer: the server answers a TLS client with the client
// certificate, and refuses a plain client and a TLS client without one.
func TestTLSServer(t *testing.T) {
	s, files := StartTLS(t)
	if files != s.Files() {
		t.Fatalf("files %+v, server has %+v", files, s.Files())
	}
	ctx := context.Background()
	c := s.Client()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET over TLS: %v", err)
	}
	if v, err := c.Get(ctx, "k").Result(); err != nil || v != "v" {
		t.Fatalf("GET over TLS = %q, %v", v, err)
	}

	try := func(conf *tls.Config) error {
		cl := redis.NewClient(&redis.Options{Addr: s.Addr(), TLSConfig: conf, MaxRetries: -1, PoolSize: 1})
		defer cl.Close()
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		return cl.Ping(ctx).Err()
	}
	if err := try(nil); err == nil {
		t.Error("a plain client got an answer from the TLS-only server")
	}
	noCert := s.clientTLS()
	noCert.Certificates = nil
	if err := try(noCert); err == nil {
		t.Error("a TLS client without a certificate got an answer; want client authentication")
	}
	noCA := s.clientTLS()
	noCA.RootCAs = nil // system roots do not know the test CA
	if err := try(noCA); err == nil {
		t.Error("a client that does not trust the test CA got an answer")
	}

	s.Stop()
	if s.Running() {
		t.Fatal("running after Stop")
	}
}
