package algorithms_test

import (
	"fmt"
	"sync"
	"time"

	"github.com/envoyrls/envoy-rls/pkg/algorithms"
)

// limiter is a tiny in-process rate limiter built on the pure functions: one
// State per key, guarded by a mutex. ResetAfter says when a key's state is
// whole again, that is, no different from a fresh one: from then on it can
// be dropped at no cost.
type limiter struct {
	mu    sync.Mutex
	limit algorithms.Limit
	keys  map[string]entry
}

type entry struct {
	state   algorithms.State
	wholeAt time.Time
}

func (l *limiter) allow(key string, now time.Time) algorithms.Decision {
	l.mu.Lock()
	defer l.mu.Unlock()
	s, d := algorithms.Decide(l.limit, l.keys[key].state, now, 1)
	if d.Allowed {
		l.keys[key] = entry{state: s, wholeAt: now.Add(d.ResetAfter)}
	}
	return d
}

// sweep drops the keys that are whole again at now.
func (l *limiter) sweep(now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for k, e := range l.keys {
		if !e.wholeAt.After(now) {
			delete(l.keys, k)
		}
	}
}

// An in-process limiter: 2 requests per second per user, with bursts of 3.
// The instants are fixed here; a program would pass time.Now().
func Example_inProcessLimiter() {
	l := &limiter{
		limit: algorithms.Limit{Algorithm: algorithms.TokenBucket, Requests: 2, Window: time.Second, Burst: 3},
		keys:  map[string]entry{},
	}
	start := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	for _, r := range []struct {
		after time.Duration
		user  string
	}{
		{0, "alice"}, {0, "alice"}, {0, "alice"}, {0, "alice"},
		{0, "bob"},
		{500 * time.Millisecond, "alice"},
	} {
		d := l.allow(r.user, start.Add(r.after))
		if d.Allowed {
			fmt.Printf("%-6v %-5s allowed, %d left, whole again in %v\n", r.after, r.user, d.Remaining, d.ResetAfter)
		} else {
			fmt.Printf("%-6v %-5s denied, retry in %v\n", r.after, r.user, d.RetryAfter)
		}
	}
	l.sweep(start.Add(time.Second))
	fmt.Println("keys held after 1s:", len(l.keys))
	l.sweep(start.Add(2 * time.Second))
	fmt.Println("keys held after 2s:", len(l.keys))
	// Output:
	// 0s     alice allowed, 2 left, whole again in 500ms
	// 0s     alice allowed, 1 left, whole again in 1s
	// 0s     alice allowed, 0 left, whole again in 1.5s
	// 0s     alice denied, retry in 500ms
	// 0s     bob   allowed, 2 left, whole again in 500ms
	// 500ms  alice allowed, 0 left, whole again in 1.5s
	// keys held after 1s: 1
	// keys held after 2s: 0
}
