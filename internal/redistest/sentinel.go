package redistest

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// StartSentinel starts a Sentinel on a free loopback port that monitors
// master under the name masterName (quorum 1), and waits until it reports
// the master's address.
func StartSentinel(tb testing.TB, master *Server, masterName string) *Server {
	tb.Helper()
	conf := func(port int) string {
		// Sentinel rewrites its config file, so it must be its own.
		return fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d 1\nsentinel down-after-milliseconds %s 1000\n",
			masterName, master.Port(), masterName)
	}
	s := startConf(tb, "sentinel.conf", conf, []string{"--sentinel"}, false)
	c := redis.NewSentinelClient(&redis.Options{Addr: s.Addr(), PoolSize: 1})
	defer c.Close()
	deadline := time.Now().Add(startTimeout)
	for {
		addr, err := c.GetMasterAddrByName(context.Background(), masterName).Result()
		if err == nil && len(addr) == 2 && addr[1] == strconv.Itoa(master.Port()) {
			return s
		}
		if time.Now().After(deadline) {
			tb.Fatalf("redistest: sentinel does not know master %s: %v %v", masterName, addr, err)
		}
		time.Sleep(pollInterval)
	}
}
