package redis

import (
	_ "embed"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/backend"
)

// The interface between the store and its script, lua/apply.lua, the Lua
// twin of backend.Transact. This file encodes the calls and decodes the
// replies; the script's copies of the constants are checked against Go by
// TestScriptConstantsMatchGo.
//
// # Call
//
//	EVALSHA sha numkeys KEYS... ARGV[argNow] ARGV[argWhole] ARGV[argItems]
//
// KEYS are the distinct Redis keys of the call's items (KeyPrefix, the hash
// tag of Item.Partition, Item.Key: see redisKey), in the order of their
// first item, all in one Cluster hash slot.
//
//   - ARGV[argNow]: the instant in µs since the Unix epoch, or "" for the
//     script to read Redis's TIME (production: instances with skewed clocks
//     agree). A given instant is for tests on a timeline (Options.Clock).
//   - ARGV[argWhole]: "1" when the items are the whole request
//     (backend.WholeRequest), "0" when they are the part of a request in one
//     Cluster slot (backend.PartOfRequest).
//   - ARGV[argItems]: itemFields decimal numbers per item, separated by
//     single spaces, in the order of the field* constants.
//
// # Reply
//
// An array: committed (1 or 0), then replyFields values per item in request
// order, in the order of the reply* constants. Allowed is 1 or 0; RetryAfter
// and ResetAfter are integer µs, -1 for algorithms.Never; Remaining is an
// integer, or a decimal string from 2^53 on (Lua numbers are doubles), with
// 18446744073709551615 for anything from 2^64 on.
//
// # State
//
// A key of fixed_window, token_bucket, sliding_window_counter or gcra holds a
// string "at count prev level": the fields of algorithms.State (at in µs,
// level the bucket's debt in token·µs), each written with 17 significant
// digits so that every double round-trips exactly.
//
// A key of sliding_window_log holds a list: one entry "at hits" per allowed
// request still in the window, oldest first (at in µs), followed by a header
// "at count" as its last element (the newest instant seen and the sum of the
// entries' hits). The script drops entries that left the window from the
// head (LTRIM) and appends new ones before the header.
//
// A state that is fresh after a committed request (the ResetAfter of its
// key's last allowing item is zero) is deleted. Otherwise its TTL is that
// ResetAfter rounded up to the millisecond; with a given instant (tests) the
// key gets no TTL, since test time does not pass with real time.

//go:embed lua/apply.lua
var applyLua string

// applyScript is the one script that decides a request's items.
var applyScript = goredis.NewScript(applyLua)

// Positions of the script's arguments in ARGV (1-based, as in Lua).
const (
	argNow   = 1
	argWhole = 2
	argItems = 3
)

// argv returns a call's ARGV in the order of the arg* constants.
func argv(now, whole, items string) []any {
	a := make([]any, 3)
	a[argNow-1], a[argWhole-1], a[argItems-1] = now, whole, items
	return a
}

// Values of ARGV[argWhole].
const (
	wholeRequest  = "1"
	partOfRequest = "0"
)

// The fields of one item in ARGV[argItems], in order.
const (
	fieldKeyIndex  = iota // 1-based index into KEYS
	fieldAlgorithm        // algorithms.Kind
	fieldRequests         // Limit.Requests
	fieldWindow           // Limit.Window in µs, at least 1
	fieldCapacity         // Limit.Capacity()
	fieldHits             // Item.Hits
	fieldMode             // backend.Mode
	fieldGroup            // Item.Group
	fieldOver             // 1 when Hits > Capacity (compared exactly here) or Requests is 0 and Hits > 0, else 0
	itemFields            // the number of fields per item (the script's ITEM_FIELDS)
)

// The values of one item in the reply, after the leading committed flag.
const (
	replyAllowed    = iota // 1 or 0
	replyRemaining         // a count
	replyRetryAfter        // µs, -1 for Never
	replyResetAfter        // µs, -1 for Never
	replyFields            // the number of values per item
)

// makeGroup encodes the items idx (with Redis keys keys) as one script call:
// KEYS and ARGV[argItems], fields in the order of the field* constants.
func makeGroup(items []backend.Item, keys []string, idx []int) group {
	g := group{idx: idx, keys: make([]string, 0, len(idx))}
	b := make([]byte, 0, 48*len(idx))
	for _, i := range idx {
		it := &items[i]
		ki := -1
		for j, k := range g.keys {
			if k == keys[i] {
				ki = j
				break
			}
		}
		if ki < 0 {
			ki = len(g.keys)
			g.keys = append(g.keys, keys[i])
		}
		w := it.Limit.Window.Microseconds()
		if w < 1 {
			w = 1
		}
		b = strconv.AppendInt(b, int64(ki+1), 10)
		b = append(b, ' ')
		b = strconv.AppendUint(b, uint64(it.Limit.Algorithm), 10)
		b = append(b, ' ')
		b = strconv.AppendUint(b, it.Limit.Requests, 10)
		b = append(b, ' ')
		b = strconv.AppendInt(b, w, 10)
		b = append(b, ' ')
		b = strconv.AppendUint(b, it.Limit.Capacity(), 10)
		b = append(b, ' ')
		b = strconv.AppendUint(b, it.Hits, 10)
		b = append(b, ' ')
		b = strconv.AppendUint(b, uint64(it.Mode), 10)
		b = append(b, ' ')
		b = strconv.AppendInt(b, int64(it.Group), 10)
		if it.Hits > it.Limit.Capacity() || (it.Limit.Requests == 0 && it.Hits > 0) {
			b = append(b, " 1 "...)
		} else {
			b = append(b, " 0 "...)
		}
	}
	g.args = string(b)
	return g
}

// errReply reports a script reply of an unexpected shape.
var errReply = errors.New("redis: unexpected reply from the script")

// decodeReply writes the decisions of g's items into out.
func decodeReply(g *group, items []backend.Item, out []algorithms.Decision) error {
	if g.cmd == nil {
		return errReply
	}
	v, err := g.cmd.Result()
	if err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	a, ok := v.([]interface{})
	if !ok || len(a) != 1+replyFields*len(g.idx) {
		return fmt.Errorf("%w: %T of %d values for %d items", errReply, v, len(a), len(g.idx))
	}
	for k, i := range g.idx {
		f := a[1+replyFields*k : 1+replyFields*(k+1)]
		allowed, ok1 := f[replyAllowed].(int64)
		remaining, ok2 := replyCount(f[replyRemaining])
		retry, ok3 := replyDuration(f[replyRetryAfter])
		reset, ok4 := replyDuration(f[replyResetAfter])
		if !ok1 || !ok2 || !ok3 || !ok4 {
			return fmt.Errorf("%w: item %d: %v", errReply, i, f)
		}
		out[i] = algorithms.Decision{
			Allowed:    allowed == 1,
			Limit:      items[i].Limit.Capacity(),
			Remaining:  remaining,
			RetryAfter: retry,
			ResetAfter: reset,
		}
	}
	return nil
}

// replyCount decodes a count: an integer, or a decimal string from 2^53 on.
func replyCount(v interface{}) (uint64, bool) {
	switch x := v.(type) {
	case int64:
		if x < 0 {
			return 0, false
		}
		return uint64(x), true
	case string:
		if u, err := strconv.ParseUint(x, 10, 64); err == nil {
			return u, true
		}
		f, err := strconv.ParseFloat(x, 64)
		if err != nil || f < 0 {
			return 0, false
		}
		if f >= math.MaxUint64 {
			return math.MaxUint64, true
		}
		return uint64(f), true
	}
	return 0, false
}

// replyDuration decodes a duration in µs, -1 meaning algorithms.Never.
func replyDuration(v interface{}) (time.Duration, bool) {
	x, ok := v.(int64)
	switch {
	case !ok || x < -1:
		return 0, false
	case x == -1 || x >= int64(algorithms.Never/time.Microsecond):
		return algorithms.Never, true
	}
	return time.Duration(x) * time.Microsecond, true
}
