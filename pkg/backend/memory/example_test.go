package memory_test

import (
	"context"
	"fmt"
	"time"

	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/backend"
	"github.com/envoyrls/envoy-rls/pkg/backend/memory"
)

// manualClock is a clock that moves only when told to, so that the example's
// output does not depend on when it runs. A real program leaves the clock
// out and gets backend.MonotonicClock().
type manualClock struct{ now time.Time }

func (c *manualClock) Now() time.Time { return c.now }

// This program limits each user to 3 calls per minute with a token bucket,
// using the memory store as an in-process limiter: no server involved.
func Example() {
	clock := &manualClock{now: time.Date(2025, 1, 1, 9, 0, 0, 0, time.UTC)}
	store := memory.New(memory.WithClock(clock))
	defer store.Close()

	perUser := algorithms.Limit{Algorithm: algorithms.TokenBucket, Requests: 3, Window: time.Minute}
	call := func(user string) {
		items := []backend.Item{{Key: "calls/" + user, Limit: perUser, Hits: 1}}
		out := make([]algorithms.Decision, len(items))
		allowed, err := store.Apply(context.Background(), items, out)
		switch {
		case err != nil:
			fmt.Println(user, "error:", err)
		case allowed:
			fmt.Printf("%s: allowed, %d left\n", user, out[0].Remaining)
		default:
			fmt.Printf("%s: denied, retry in %v\n", user, out[0].RetryAfter)
		}
	}

	for range 4 {
		call("alice")
	}
	call("bob")
	clock.now = clock.now.Add(20 * time.Second) // one token refills every 20s
	call("alice")
	// Output:
	// alice: allowed, 2 left
	// alice: allowed, 1 left
	// alice: allowed, 0 left
	// alice: denied, retry in 20s
	// bob: allowed, 2 left
	// alice: allowed, 0 left
}
