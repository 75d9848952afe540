package redis

import (
	"context"
	"strconv"
	"strings"
	"sync"

	goredis "github.com/redis/go-redis/v9"
)

// ServerLimits is what a Redis server said about its memory limit when a
// connection to it was made (at start-up, and on every reconnect).
type ServerLimits struct {
	// Addr is the server's address as dialled.
	Addr string
	// MaxMemory is its maxmemory in bytes; 0 means no limit.
	MaxMemory uint64
	// Policy is its maxmemory-policy, e.g. "noeviction" or "allkeys-lru".
	Policy string
}

// EvictsCounters reports whether the server may evict live counters: it
// has a memory limit and a policy other than noeviction. Every counter key
// has a TTL, so the volatile-* policies evict them as the allkeys-* ones
// do; a flood of new keys then evicts the counter of an exhausted key,
// which allows its full limit again.
func (l ServerLimits) EvictsCounters() bool {
	return l.MaxMemory > 0 && l.Policy != "noeviction"
}

// limitsWatch reads a server's limits on each new connection.
type limitsWatch struct {
	notify func(ServerLimits) // Options.OnServerLimits; may be nil
	mu     sync.Mutex
	last   map[string]ServerLimits
}

// onConnect is go-redis's OnConnect hook: it reads INFO memory on the new
// connection (CONFIG may be disabled on managed servers; INFO is not). A
// server that does not answer INFO is left alone.
func (w *limitsWatch) onConnect(ctx context.Context, cn *goredis.Conn) error {
	s, err := cn.Info(ctx, "memory").Result()
	if err != nil {
		return nil
	}
	l, ok := parseMemoryInfo(s)
	if !ok {
		return nil // a Sentinel, or a server that hides these fields
	}
	// "Redis<host:port db:N>"
	l.Addr = strings.TrimPrefix(cn.String(), "Redis<")
	if f := strings.Fields(l.Addr); len(f) > 0 {
		l.Addr = f[0]
	}
	w.mu.Lock()
	prev, seen := w.last[l.Addr]
	w.last[l.Addr] = l
	w.mu.Unlock()
	if w.notify != nil && (!seen || prev != l) {
		w.notify(l)
	}
	return nil
}

// limits returns what each server said last.
func (w *limitsWatch) limits() []ServerLimits {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]ServerLimits, 0, len(w.last))
	for _, l := range w.last {
		out = append(out, l)
	}
	return out
}

// parseMemoryInfo reads maxmemory and maxmemory_policy from INFO memory.
func parseMemoryInfo(info string) (ServerLimits, bool) {
	var l ServerLimits
	var haveMax, havePolicy bool
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		switch k {
		case "maxmemory":
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				return l, false
			}
			l.MaxMemory, haveMax = n, true
		case "maxmemory_policy":
			l.Policy, havePolicy = v, true
		}
	}
	return l, haveMax && havePolicy
}
