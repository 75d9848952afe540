package redistest

import (
	"context"
	"testing"
	"time"
)

// TestReplica: a replica started by StartReplica receives the master's
// writes, reports the slave role, and a failover Sentinel started after it
// lists it as healthy.
func TestReplica(t *testing.T) {
	master := StartStandalone(t)
	replica := StartReplica(t, master)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	mc := master.Client()
	if err := mc.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := mc.Do(ctx, "WAIT", 1, 5000).Int(); err != nil || n != 1 {
		t.Fatalf("WAIT: %d replicas acknowledged, error %v; want 1", n, err)
	}
	if v, err := replica.Client().Get(ctx, "k").Result(); err != nil || v != "v" {
		t.Fatalf("GET k on the replica = %q, %v; want v", v, err)
	}
	for _, c := range []struct {
		s    *Server
		role string
	}{{master, "master"}, {replica, "slave"}} {
		if role, err := c.s.Role(ctx); err != nil || role != c.role {
			t.Errorf("port %d: ROLE %q, %v; want %q", c.s.Port(), role, err, c.role)
		}
	}
	sentinel := StartFailoverSentinel(t, master, "m", replica)
	if role, err := sentinel.Role(ctx); err != nil || role != "sentinel" {
		t.Errorf("sentinel: ROLE %q, %v; want sentinel", role, err)
	}
}
