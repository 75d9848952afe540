package redis

import (
	"context"

	goredis "github.com/redis/go-redis/v9"
)

// Ping checks that Redis answers: the server (or the Sentinel's current
// master) on a standalone or Sentinel setup, every master on a Cluster. Its
// error says why not (connection refused, host not found, a TLS or
// authentication failure), where a call of Apply that runs out of time
// while go-redis retries only says that time ran out. envoy-rls uses it for
// its readiness at start-up.
func (r *Store) Ping(ctx context.Context) error {
	if c, ok := r.client.(*goredis.ClusterClient); ok {
		return c.ForEachMaster(ctx, func(ctx context.Context, m *goredis.Client) error {
			return m.Ping(ctx).Err()
		})
	}
	return r.client.Ping(ctx).Err()
}
