package redis

import goredis "github.com/redis/go-redis/v9"

// Client returns the store's Redis client, for other state that lives
// beside the counters (the RLQS service's shares). It is closed with the
// store.
func (r *Store) Client() goredis.UniversalClient { return r.client }

// KeyPrefix returns the prefix of the store's keys (Options.KeyPrefix).
func (r *Store) KeyPrefix() string { return r.prefix }
