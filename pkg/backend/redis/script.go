package redis

import (
	"context"
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
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
// twin of backend.Transact and pkg/algorithms. This file encodes the calls
// and decodes the replies; the script's copies of the constants are checked
// against Go by TestScriptConstantsMatchGo.
//
// # Call
//
//	FCALL envoyrls_apply_<version> numkeys KEYS... ARGV...
//
// or, on a server without functions (before Redis 7.0), EVALSHA/EVAL of the
// same code with the same KEYS and ARGV. One call decides a batch: the
// requests of one pipeline (on a Cluster, their parts in one hash slot), in
// order, each all-or-nothing on its own and seeing what the ones before it
// charged. Each key is read at most once and written at most once per call.
//
// KEYS are the distinct Redis keys of the call's items (KeyPrefix, the hash
// tag of Item.Partition, Item.Key: see redisKey), all in one Cluster slot.
//
// ARGV holds the requests one after the other, each:
//
//   - now: the instant in µs since the Unix epoch, or "" for the script to
//     read Redis's TIME (once per call; production: instances with skewed
//     clocks agree). A given instant is for tests on a timeline
//     (newStore's clock); keys written by such a call get no TTL.
//   - n: the number of items, positive for backend.WholeRequest, negative
//     (-n) for backend.PartOfRequest (the part of a request in one slot).
//   - itemFields numbers per item, in the order of the field* constants.
//     fieldFlags is algorithm + flagMode*mode + flagOver*over +
//     flagAccount*account + flagGroup*group (the algorithms.Kind and
//     backend.Mode values; over is 1 when Hits > Capacity, compared exactly
//     here as two huge numbers may be one double, or Requests is 0 and
//     Hits > 0; account is 1 for usage accounting, Item.Account with
//     Hits > 0, charged whatever the verdict even when it does not fit;
//     group is the rank of the item's quota group among the request's).
//
// # Reply
//
// Integers only (read without boxing or parsing strings): per request its
// verdict (1: committed, 0: nothing charged), then replyFields values per
// item in the order of the reply* constants. Remaining is split as hi*2^32
// + lo (hi = 2^32 stands for 2^64 and more, read as math.MaxUint64);
// RetryAfter and ResetAfter are µs, -1 for algorithms.Never.
//
// # State
//
// Each key holds its state in the key's own type; at, counts and instants
// are integers written in decimal, and a number that is not an integer
// below 2^53 (a bucket's level can be) with 17 significant digits, so every
// double reads back exactly:
//
//	fixed_window            string "at count"
//	sliding_window_counter  string "at count prev"
//	token_bucket, gcra      string "at level" (level: the debt in token·µs)
//	sliding_window_log      list: at index 0 the header "at count last"
//	                        (the newest instant seen, the sum of the
//	                        entries' hits, the newest entry's instant), then
//	                        one entry per allowed request still in the
//	                        window, oldest first: "at", or "at hits" when
//	                        hits > 1
//
// The script reads a log's header and first entries with one LRANGE and
// more in growing chunks only while entries leave the window; it drops them
// with LTRIM, rewrites the header with LSET and appends with RPUSH.
//
// A state that is fresh after a committed request (the ResetAfter of its
// key's last allowing item is zero) is deleted. Otherwise its TTL is that
// ResetAfter rounded up to the millisecond.
//
// A key that holds anything else (another type, or the format of an
// earlier version) is deleted and starts fresh rather than failing the
// whole script call, and so every request batched with it: across an
// upgrade that changes the format, such a key forgets at most one window's
// hits.

//go:embed lua/apply.lua
var applyLua string

// scriptVersion names the library and function after the script's
// content, so that instances running different versions side by side on
// one Redis each call their own.
var scriptVersion = func() string {
	h := sha1.Sum([]byte(applyLua))
	return hex.EncodeToString(h[:6])
}()

// Function and library names, and the two wrappings of apply.lua.
var (
	functionName = "envoyrls_apply_" + scriptVersion
	libraryCode  = "#!lua name=envoyrls_" + scriptVersion + "\n" + applyLua +
		"\nredis.register_function('" + functionName + "', function(keys, args) return apply(keys, args) end)\n"
	evalCode   = applyLua + "\nreturn apply(KEYS, ARGV)\n"
	evalScript = goredis.NewScript(evalCode)
)

// The numbers of one item in ARGV, in order (the offsets the script reads
// them at).
const (
	fieldKeyIndex = iota // 1-based index into KEYS
	fieldFlags           // algorithm + flagMode*mode + flagOver*over + flagGroup*group
	fieldRequests        // Limit.Requests
	fieldWindow          // Limit.Window in µs, at least 1
	fieldCapacity        // Limit.Capacity()
	fieldHits            // Item.Hits
	itemFields           // the number of fields per item (the script's ITEM_FIELDS)
)

// Multipliers in fieldFlags (the script's FLAG_*): the mode, the over bit,
// the usage accounting bit and the item's quota group (its rank among the
// request's distinct groups).
const (
	flagMode    = 8
	flagOver    = 64
	flagAccount = 128
	flagGroup   = 256
)

// The values of one item in the reply, after its request's verdict.
const (
	replyAllowedHi  = iota // allowed + 2*hi
	replyLo                // lo: remaining = hi*2^32 + lo
	replyRetryAfter        // µs, -1 for Never
	replyResetAfter        // µs, -1 for Never
	replyFields            // the number of values per item
)

// item is one Item as the script call takes it, encoded in the caller's
// goroutine (so the pipeline worker never reads the caller's items).
type item struct {
	key                      string
	flags                    int64
	requests, capacity, hits uint64
	window                   int64
}

// encodeItem encodes items[i], whose Redis key is key. Its quota group
// goes in as the group's rank among the request's distinct groups (the
// script only compares groups), so any Item.Group fits.
func encodeItem(items []backend.Item, i int, key string) item {
	it := &items[i]
	w := it.Limit.Window.Microseconds()
	if w < 1 {
		w = 1
	}
	flags := int64(it.Limit.Algorithm) + flagMode*int64(it.Mode)
	if it.Hits > it.Limit.Capacity() || (it.Limit.Requests == 0 && it.Hits > 0) {
		flags += flagOver
	}
	if it.Account && it.Hits > 0 {
		flags += flagAccount
	}
	if it.Mode == backend.Quota {
		// The distinct groups before the group's first item.
		var rank int64
		seen := map[int]bool{} // only requests with quota items get here
		for j := 0; j < i; j++ {
			g := items[j].Group
			if items[j].Mode != backend.Quota || seen[g] {
				continue
			}
			if g == it.Group {
				break
			}
			seen[g] = true
			rank++
		}
		flags += flagGroup * rank
	}
	return item{key: key, flags: flags, requests: it.Limit.Requests, capacity: it.Limit.Capacity(),
		hits: it.Hits, window: w}
}

// scriptCall is one FCALL (or EVALSHA) of a pipeline: the groups of a
// batch that share a slot (all of them on a standalone server).
type scriptCall struct {
	keys   []string
	index  map[string]int // key -> 1-based index into keys
	args   []interface{}
	groups []*group
	cmd    *goredis.IntSliceCmd
}

func newScriptCall() *scriptCall {
	return &scriptCall{index: make(map[string]int)}
}

// add appends the request part g (with the call's now) to sc.
func (sc *scriptCall) add(g *group, now string, whole bool) {
	g.call = sc
	sc.groups = append(sc.groups, g)
	n := int64(len(g.items))
	if !whole {
		n = -n
	}
	sc.args = append(sc.args, now, n)
	for i := range g.items {
		it := &g.items[i]
		ki, ok := sc.index[it.key]
		if !ok {
			sc.keys = append(sc.keys, it.key)
			ki = len(sc.keys)
			sc.index[it.key] = ki
		}
		var f [itemFields]any
		f[fieldKeyIndex], f[fieldFlags], f[fieldRequests], f[fieldWindow] = ki, it.flags, it.requests, it.window
		f[fieldCapacity], f[fieldHits] = it.capacity, it.hits
		sc.args = append(sc.args, f[:]...)
	}
}

// command returns sc as an FCALL command, or with evalsha as an EVALSHA
// one, or with source as an EVAL.
func (sc *scriptCall) command(ctx context.Context, evalsha, source bool) *goredis.IntSliceCmd {
	args := make([]interface{}, 0, 3+len(sc.keys)+len(sc.args))
	switch {
	case source:
		args = append(args, "eval", evalCode)
	case evalsha:
		args = append(args, "evalsha", evalScript.Hash())
	default:
		args = append(args, "fcall", functionName)
	}
	args = append(args, len(sc.keys))
	for _, k := range sc.keys {
		args = append(args, k)
	}
	args = append(args, sc.args...)
	return goredis.NewIntSliceCmd(ctx, args...)
}

// errReply reports a script reply of an unexpected shape.
var errReply = errors.New("redis: unexpected reply from the redis script")

// decode splits the script call's reply among its groups.
func (sc *scriptCall) decode() {
	v, err := sc.cmd.Result()
	if err != nil {
		for _, g := range sc.groups {
			g.err = fmt.Errorf("redis: %w", err)
		}
		return
	}
	at := 0
	for _, g := range sc.groups {
		n := 1 + replyFields*len(g.items)
		if at+n > len(v) {
			g.err = fmt.Errorf("%w: %d values for %d groups", errReply, len(v), len(sc.groups))
			continue
		}
		g.reply = v[at : at+n]
		at += n
	}
	if at != len(v) {
		for _, g := range sc.groups {
			g.err = fmt.Errorf("%w: %d values, %d expected", errReply, len(v), at)
		}
	}
}

// decodeGroup writes the decisions of g's items into out.
func decodeGroup(g *group, items []backend.Item, out []algorithms.Decision) error {
	if g.err != nil {
		return g.err
	}
	if len(g.reply) != 1+replyFields*len(g.idx) {
		return fmt.Errorf("%w: %d values for %d items", errReply, len(g.reply), len(g.idx))
	}
	for k, i := range g.idx {
		f := g.reply[1+replyFields*k : 1+replyFields*(k+1)]
		a, b := f[replyAllowedHi], f[replyLo]
		allowed := a & 1
		hi, lo := uint64(a>>1), uint64(b)
		retry, ok1 := replyDuration(f[replyRetryAfter])
		reset, ok2 := replyDuration(f[replyResetAfter])
		if a < 0 || b < 0 || lo >= 1<<32 || hi > 1<<32 || !ok1 || !ok2 {
			return fmt.Errorf("%w: item %d: %v", errReply, i, f)
		}
		remaining := hi<<32 | lo
		if hi == 1<<32 {
			remaining = math.MaxUint64
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

// replyDuration decodes a duration in µs, -1 meaning algorithms.Never.
func replyDuration(x int64) (time.Duration, bool) {
	switch {
	case x < -1:
		return 0, false
	case x == -1 || x >= int64(algorithms.Never/time.Microsecond):
		return algorithms.Never, true
	}
	return time.Duration(x) * time.Microsecond, true
}

// nowArg is ARGV's now for a store with clock (nil: Redis's TIME).
func nowArg(clock backend.Clock) string {
	if clock == nil {
		return ""
	}
	return strconv.FormatInt(max(clock.Now().UnixMicro(), 0), 10)
}
