package redis

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/backend"
)

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

// StateNumbers decodes a string state as the script writes it (see
// script.go): its algorithm and its numbers (fixed window: at, count).
func StateNumbers(v string) (algorithms.Kind, []float64, error) {
	if len(v) != 17 && len(v) != 25 && len(v) != 33 || v[0] < stateMagic {
		return 0, nil, fmt.Errorf("not a state: %x", v)
	}
	var f []float64
	for at := 1; at < len(v); at += 8 {
		f = append(f, math.Float64frombits(binary.LittleEndian.Uint64([]byte(v[at:at+8]))))
	}
	return algorithms.Kind(v[0] - stateMagic), f, nil
}
