package redistest

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Cluster is a Redis Cluster of masters without replicas, each a Server.
type Cluster struct {
	// Nodes are the masters, in the order of their slot ranges.
	Nodes []*Server
}

// Addrs returns the nodes' addresses.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		addrs[i] = n.Addr()
	}
	return addrs
}

// Client returns a go-redis cluster client, closed when the test ends.
func (c *Cluster) Client(tb testing.TB) *redis.ClusterClient {
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	tb.Cleanup(func() { cc.Close() })
	return cc
}

// Slots is the number of hash slots of a Redis Cluster.
const Slots = 16384

// StartCluster starts a Redis Cluster of the given number of masters (at
// least 3 is what Redis expects of a real cluster; 1 works too), splits the
// slots evenly between them in order, and waits until every node reports
// cluster_state:ok and knows every other node.
func StartCluster(tb testing.TB, masters int) *Cluster {
	tb.Helper()
	if masters < 1 {
		tb.Fatalf("redistest: a cluster needs at least one master, got %d", masters)
	}
	c := &Cluster{}
	for i := 0; i < masters; i++ {
		c.Nodes = append(c.Nodes, start(tb, []string{
			"--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "2000",
			"--cluster-require-full-coverage", "yes",
		}, true))
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	clients := make([]*redis.Client, masters)
	for i, n := range c.Nodes {
		clients[i] = redis.NewClient(&redis.Options{Addr: n.Addr(), PoolSize: 1})
		defer clients[i].Close()
	}
	for i, cl := range clients {
		lo, hi := SlotRange(i, masters)
		if err := addSlots(ctx, cl, lo, hi); err != nil {
			tb.Fatalf("redistest: assign slots %d-%d to %s: %v", lo, hi, c.Nodes[i].Addr(), err)
		}
	}
	for i := 1; i < masters; i++ {
		if err := clients[i].ClusterMeet(ctx, "127.0.0.1", strconv.Itoa(c.Nodes[0].Port())).Err(); err != nil {
			tb.Fatalf("redistest: CLUSTER MEET from %s: %v", c.Nodes[i].Addr(), err)
		}
	}
	if err := c.waitOK(ctx, clients); err != nil {
		tb.Fatalf("redistest: cluster did not become ready: %v", err)
	}
	return c
}

// SlotRange returns the slots [lo, hi] that StartCluster assigns to node i of
// n.
func SlotRange(i, n int) (lo, hi int) {
	return i * Slots / n, (i+1)*Slots/n - 1
}

func addSlots(ctx context.Context, c *redis.Client, lo, hi int) error {
	err := c.ClusterAddSlotsRange(ctx, lo, hi).Err()
	if err == nil || !strings.Contains(strings.ToLower(err.Error()), "unknown") {
		return err
	}
	// Redis before 7.0 has no ADDSLOTSRANGE.
	slots := make([]int, 0, hi-lo+1)
	for s := lo; s <= hi; s++ {
		slots = append(slots, s)
	}
	return c.ClusterAddSlots(ctx, slots...).Err()
}

// waitOK polls CLUSTER INFO on every node until all report cluster_state:ok
// and know all nodes.
func (c *Cluster) waitOK(ctx context.Context, clients []*redis.Client) error {
	want := fmt.Sprintf("cluster_known_nodes:%d", len(clients))
	var last string
	for {
		ready := true
		for _, cl := range clients {
			info, err := cl.ClusterInfo(ctx).Result()
			if err != nil {
				last = err.Error()
				ready = false
				break
			}
			if !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, want) {
				last = info
				ready = false
				break
			}
		}
		if ready {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w; last CLUSTER INFO: %s", ctx.Err(), last)
		case <-time.After(pollInterval):
		}
	}
}

// WaitOK polls until every node of the cluster reports cluster_state:ok and
// knows every node again, e.g. after a node was restarted.
func (c *Cluster) WaitOK(tb testing.TB) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	clients := make([]*redis.Client, len(c.Nodes))
	for i, n := range c.Nodes {
		clients[i] = redis.NewClient(&redis.Options{Addr: n.Addr(), PoolSize: 1})
		defer clients[i].Close()
	}
	if err := c.waitOK(ctx, clients); err != nil {
		tb.Fatalf("redistest: cluster not ready: %v", err)
	}
}
