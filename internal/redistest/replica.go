package redistest

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Sentinel timings of StartFailoverSentinel: the master is subjectively
// (and, with quorum 1, objectively) down after FailoverDownAfter without an
// answer, and a failover that has not completed within failoverTimeout is
// abandoned.
const (
	FailoverDownAfter = 1000 * time.Millisecond
	failoverTimeout   = 5000 * time.Millisecond
)

// StartReplica starts a redis-server on a free loopback port that
// replicates master (--replicaof 127.0.0.1 <port>), and waits until its
// link to the master is up (INFO replication reports
// master_link_status:up), so the master lists it as a connected replica.
// It is stopped when the test ends.
//
// It first sets the master's repl-diskless-sync-delay to 0: Redis 7 waits
// 5 seconds by default before a diskless full sync, for more replicas to
// join it.
func StartReplica(tb testing.TB, master *Server) *Server {
	tb.Helper()
	mc := redis.NewClient(&redis.Options{Addr: master.Addr(), PoolSize: 1})
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	err := mc.ConfigSet(ctx, "repl-diskless-sync-delay", "0").Err()
	cancel()
	mc.Close()
	if err != nil {
		tb.Fatalf("redistest: master on port %d: CONFIG SET repl-diskless-sync-delay: %v", master.Port(), err)
	}
	s := start(tb, []string{"--replicaof", "127.0.0.1", strconv.Itoa(master.Port())}, false)
	s.waitLinkUp(tb)
	return s
}

// waitLinkUp polls INFO replication of a replica until it reports
// master_link_status:up, failing the test after startTimeout.
func (s *Server) waitLinkUp(tb testing.TB) {
	tb.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), PoolSize: 1})
	defer c.Close()
	var last string
	err := replPoll(func(ctx context.Context) bool {
		info, err := c.Info(ctx, "replication").Result()
		last = fmt.Sprint(info, err)
		return err == nil && replInfoField(info, "master_link_status") == "up"
	})
	if err != nil {
		tb.Fatalf("redistest: replica on port %d: link to its master not up: %v; last INFO: %s", s.port, err, last)
	}
}

// Role returns the first word of the server's ROLE reply: "master",
// "slave" or "sentinel".
func (s *Server) Role(ctx context.Context) (string, error) {
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), PoolSize: 1, MaxRetries: -1})
	defer c.Close()
	v, err := c.Do(ctx, "ROLE").Slice()
	if err != nil {
		return "", err
	}
	if len(v) == 0 {
		return "", fmt.Errorf("redistest: empty ROLE reply")
	}
	role, ok := v[0].(string)
	if !ok {
		return "", fmt.Errorf("redistest: ROLE reply %v", v)
	}
	return role, nil
}

// StartFailoverSentinel starts a Sentinel on a free loopback port that
// monitors master under masterName and fails over quickly: quorum 1 (this
// Sentinel alone decides), down-after-milliseconds FailoverDownAfter and
// failover-timeout of a few seconds. It waits until the Sentinel reports
// the master's address and lists each of replicas as a healthy replica
// (flags exactly "slave", master link ok), so that a failover can promote
// one of them as soon as the master fails.
//
// Sentinel learns replicas from the master's INFO, which it asks for when
// it connects and then only every 10 seconds: start the replicas (with
// StartReplica) before the Sentinel, or this waits up to that long.
func StartFailoverSentinel(tb testing.TB, master *Server, masterName string, replicas ...*Server) *Server {
	tb.Helper()
	conf := func(port int) string {
		// Sentinel rewrites its config file, so it must be its own.
		return fmt.Sprintf("sentinel monitor %[1]s 127.0.0.1 %[2]d 1\n"+
			"sentinel down-after-milliseconds %[1]s %[3]d\n"+
			"sentinel failover-timeout %[1]s %[4]d\n"+
			"sentinel parallel-syncs %[1]s 1\n",
			masterName, master.Port(), FailoverDownAfter.Milliseconds(), failoverTimeout.Milliseconds())
	}
	s := startConf(tb, "sentinel.conf", conf, []string{"--sentinel"}, false)
	c := redis.NewSentinelClient(&redis.Options{Addr: s.Addr(), PoolSize: 1})
	defer c.Close()
	var last string
	err := replPoll(func(ctx context.Context) bool {
		addr, err := c.GetMasterAddrByName(ctx, masterName).Result()
		if err != nil || len(addr) != 2 || addr[1] != strconv.Itoa(master.Port()) {
			last = fmt.Sprintf("master address %v %v", addr, err)
			return false
		}
		listed, err := c.Replicas(ctx, masterName).Result()
		if err != nil {
			last = fmt.Sprintf("SENTINEL REPLICAS: %v", err)
			return false
		}
		last = fmt.Sprintf("SENTINEL REPLICAS: %v", listed)
		for _, r := range replicas {
			if !healthyReplica(listed, r) {
				return false
			}
		}
		return true
	})
	if err != nil {
		tb.Fatalf("redistest: sentinel for %s not ready: %v; last: %s", masterName, err, last)
	}
	return s
}

// healthyReplica reports whether the SENTINEL REPLICAS reply listed holds r
// as a connected replica whose link to the master is ok.
func healthyReplica(listed []map[string]string, r *Server) bool {
	for _, m := range listed {
		if m["ip"] == "127.0.0.1" && m["port"] == strconv.Itoa(r.Port()) {
			return m["flags"] == "slave" && m["master-link-status"] == "ok"
		}
	}
	return false
}

// WaitPromoted polls until the Sentinel sentinel reports replica as the
// address of masterName and replica itself reports the master role, i.e.
// until a failover to replica has completed; it fails the test after
// timeout.
func WaitPromoted(tb testing.TB, sentinel *Server, masterName string, replica *Server, timeout time.Duration) {
	tb.Helper()
	c := redis.NewSentinelClient(&redis.Options{Addr: sentinel.Addr(), PoolSize: 1})
	defer c.Close()
	want := replica.Addr()
	var last string
	err := replPollFor(timeout, func(ctx context.Context) bool {
		addr, err := c.GetMasterAddrByName(ctx, masterName).Result()
		if err != nil || len(addr) != 2 || net.JoinHostPort(addr[0], addr[1]) != want {
			last = fmt.Sprintf("sentinel reports master %v %v", addr, err)
			return false
		}
		role, err := replica.Role(ctx)
		last = fmt.Sprintf("replica role %q %v", role, err)
		return err == nil && role == "master"
	})
	if err != nil {
		tb.Fatalf("redistest: %s not promoted to master of %s: %v; last: %s", want, masterName, err, last)
	}
}

// replPoll calls cond every pollInterval until it returns true or startTimeout
// passes; each call gets a context of at most a second.
func replPoll(cond func(ctx context.Context) bool) error {
	return replPollFor(startTimeout, cond)
}

// replPollFor is replPoll with the given timeout.
func replPollFor(timeout time.Duration, cond func(ctx context.Context) bool) error {
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		ok := cond(ctx)
		cancel()
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %v", timeout)
		}
		time.Sleep(pollInterval)
	}
}

// replInfoField returns the value of field in an INFO reply ("field:value"
// lines), or "" when it is absent.
func replInfoField(info, field string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v
		}
	}
	return ""
}
