package redis_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/envoyrls/envoy-rls/internal/redistest"
	"github.com/envoyrls/envoy-rls/pkg/backend/redis"
)

// TestPingSaysWhy: Ping succeeds while Redis is up and names the cause
// when it is not, on a short deadline and at once after Close.
func TestPingSaysWhy(t *testing.T) {
	srv := redistest.StartStandalone(t)
	r := newRedisStore(t, redis.Options{URL: srv.URL()})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := r.Ping(ctx); err != nil {
		t.Fatalf("Ping while up: %v", err)
	}
	srv.Stop()
	if err := r.Ping(ctx); err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("Ping while down: %v, want connection refused", err)
	}
	srv.Restart()
	if err := r.Ping(ctx); err != nil {
		t.Fatalf("Ping after a restart: %v", err)
	}
}
