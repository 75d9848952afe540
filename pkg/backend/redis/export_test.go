package redis

import "github.com/envoyrls/envoy-rls/pkg/backend"

// Slot exposes slot to the tests.
var Slot = slot

// RedisKey exposes redisKey to the tests.
func RedisKey(prefix string, it backend.Item) string { return redisKey(prefix, &it) }

// ForceEval makes s call the script with EVALSHA/EVAL, as it does on a
// server without functions (Redis before 7.0).
func ForceEval(s *Store) { s.evalOnly.Store(true) }

// NewWithClock is New with the script's instant read from clock instead of
// Redis's TIME (see newStore).
func NewWithClock(opts Options, clock backend.Clock) (*Store, error) { return newStore(opts, clock) }
