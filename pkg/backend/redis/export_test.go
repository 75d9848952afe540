package redis

import "github.com/envoyrls/envoy-rls/pkg/backend"

// Slot exposes slot to the tests.
var Slot = slot

// RedisKey exposes redisKey to the tests.
func RedisKey(prefix string, it backend.Item) string { return redisKey(prefix, &it) }
