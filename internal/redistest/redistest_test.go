package redistest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestStandaloneStopRestart(t *testing.T) {
	s := StartStandalone(t)
	c := s.Client()
	ctx := context.Background()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	s.Stop()
	if s.Running() {
		t.Fatal("running after Stop")
	}
	ctx2, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if err := c.Ping(ctx2).Err(); err == nil {
		t.Fatal("PING succeeded on a stopped server")
	}
	s.Restart()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after restart: %v", err)
	}
	// No persistence: the key is gone.
	if n, err := c.Exists(ctx, "k").Result(); err != nil || n != 0 {
		t.Fatalf("EXISTS k after restart = %d, %v; want 0", n, err)
	}
}

func TestCluster(t *testing.T) {
	cl := StartCluster(t, 3)
	c := cl.Client(t)
	ctx := context.Background()
	for i := 0; i < 50; i++ {
		k := fmt.Sprintf("key%d", i)
		if err := c.Set(ctx, k, i, 0).Err(); err != nil {
			t.Fatalf("SET %s: %v", k, err)
		}
	}
	// Every master holds some of the keys.
	for _, n := range cl.Nodes {
		size, err := n.Client().DBSize(ctx).Result()
		if err != nil || size == 0 {
			t.Fatalf("node %s holds %d keys (%v); want some", n.Addr(), size, err)
		}
	}
}

func TestSentinel(t *testing.T) {
	m := StartStandalone(t)
	s := StartSentinel(t, m, "mymaster")
	c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "mymaster", SentinelAddrs: []string{s.Addr()}})
	defer c.Close()
	ctx := context.Background()
	if err := c.Set(ctx, "via-sentinel", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if v := m.Client().Get(ctx, "via-sentinel").Val(); v != "1" {
		t.Fatalf("the master holds %q, want the key written through the sentinel", v)
	}
}
