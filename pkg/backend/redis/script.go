package redis

import (
	"context"
	"crypto/sha1"
	_ "embed"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/backend"
)

// The interface between the store and its script, lua/*.lua, the Lua
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
// ARGV is one binary string (read with Lua's struct library, so the script
// parses no text): the requests one after the other, little-endian, each
// a header of requestBytes,
//
//   - now, float64: the instant in µs since the Unix epoch, or -1 for the
//     script to read Redis's TIME (once per call; production: instances
//     with skewed clocks agree). A given instant is for tests on a timeline
//     (newStore's clock); keys written by such a call get their TTLs an
//     hour longer (testTTLSlack), so that none expires during a test.
//   - n, int32: the number of items, positive for backend.WholeRequest,
//     negative (-n) for backend.PartOfRequest (the part of a request in one
//     slot).
//
// then itemBytes per item: the 1-based index into KEYS (uint32); the
// algorithms.Kind, the backend.Mode and the bits (bitOver: Hits > Capacity,
// compared exactly here as two huge numbers may be one double, or Requests
// is 0 and Hits > 0; bitAccount: usage accounting, Item.Account with
// Hits > 0, charged whatever the verdict even when it does not fit), one
// byte each; the rank of the item's quota group among the request's
// (uint32); Limit.Requests, the window in µs (at least 1),
// Limit.Capacity() and Item.Hits as float64 (rounded to nearest, as the
// script's numbers are doubles).
//
// A refund (see Store.refund) is a request whose items have the bits
// bitRefund alone, each followed by a float64: the state's at that the
// charge to take back wrote. A call that holds refunds holds nothing else.
//
// # Reply
//
// Integers only (read without boxing or parsing strings): per request its
// verdict (1: committed, 0: nothing charged), then replyFields values per
// item in the order of the reply* constants, then, for a PartOfRequest
// only, one value per item: the state's at its charge wrote when the part
// committed and the item was charged, else -1 (what a refund takes). A
// refund's verdict is 1, and its items' values are a check of their key's
// state after the refund, allowed. Remaining is split as hi*2^32
// + lo (hi = 2^32 stands for 2^64 and more, read as math.MaxUint64);
// RetryAfter and ResetAfter are µs, -1 for algorithms.Never.
//
// # State
//
// Each key holds its state in the key's own type, binary: a first byte
// stateMagic + the algorithm, then little-endian float64s (doubles read
// back exactly, so a bucket's fractional level needs no text format):
//
//	fixed_window            string: magic, at, count (17 bytes)
//	sliding_window_counter  string: magic, at, count, prev (25 bytes)
//	token_bucket, gcra      string: magic, at, level (17 bytes; level: the
//	                        debt in token·µs)
//	sliding_window_log      list: at index 0 the header magic, at, count,
//	                        last (the newest instant seen, the sum of the
//	                        entries' hits, the newest entry's instant), then
//	                        one entry per allowed request still in the
//	                        window, oldest first: at (8 bytes), or at, hits
//	                        (16 bytes) when hits > 1
//
// The script reads a log's header and first entries with one LRANGE and
// more in growing chunks only while entries leave the window; it drops them
// with LTRIM, rewrites the header with LSET and appends with RPUSH.
//
// A state that is fresh after a committed request (the ResetAfter of its
// key's last allowing item is zero) is deleted. Otherwise its TTL is that
// ResetAfter rounded up to the millisecond (algorithms.Never, about 292
// years, for a state that is fresh only later still: every key written
// expires, as the memory store drops such an entry then; with the debt cap
// of algorithms.MaxDebt only a limit whose full refill takes that long gets
// it): SET ... PX, except for a fixed
// window or sliding counter key that already held a count in the same
// window, whose TTL already ends at that instant (rounded when it was set):
// SET ... KEEPTTL, which costs Redis less than half as much.
//
// A key that holds anything else (another type, or the format of an
// earlier version) is deleted and starts fresh rather than failing the
// whole script call, and so every request batched with it: across an
// upgrade that changes the format, such a key forgets at most one window's
// hits.

// The script, in three files joined in this order (see lua/state.lua).
var (
	//go:embed lua/state.lua
	stateLua string
	//go:embed lua/algorithms.lua
	algorithmsLua string
	//go:embed lua/apply.lua
	transactionLua string

	applyLua = stateLua + algorithmsLua + transactionLua
)

// scriptVersion names the library and function after the script's
// content, so that instances running different versions side by side on
// one Redis each call their own.
var scriptVersion = func() string {
	h := sha1.Sum([]byte(applyLua))
	return hex.EncodeToString(h[:6])
}()

// Function and library names, and the two wrappings of the script.
var (
	functionName = "envoyrls_apply_" + scriptVersion
	libraryCode  = "#!lua name=envoyrls_" + scriptVersion + "\n" + applyLua +
		"\nredis.register_function('" + functionName + "', function(keys, args) return apply(keys, args) end)\n"
	evalCode   = applyLua + "\nreturn apply(KEYS, ARGV)\n"
	evalScript = goredis.NewScript(evalCode)

	// The same, in interfaces once for all (a string put into an
	// interface is copied to the heap).
	functionNameArg interface{} = functionName
	evalCodeArg     interface{} = evalCode
)

// The binary layout of ARGV (the script's REQUEST_BYTES, ITEM_BYTES,
// BIT_* and MAGIC).
const (
	requestBytes = 8 + 4                   // now, n
	itemBytes    = 4 + 1 + 1 + 1 + 4 + 4*8 // key index, algorithm, mode, bits, group, four numbers
	bitOver      = 1
	bitAccount   = 2
	bitRefund    = 4   // a refund item (see Store.refund), followed by its charge's at (float64)
	stateMagic   = 240 // the first byte of a state is stateMagic + its algorithm
)

// testTTLSlack is added to the TTLs of keys written with a given now (a
// test's clock; the script's TEST_TTL_SLACK_MS).
const testTTLSlack = time.Hour

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
	alg, mode, bits          uint8
	group                    uint32 // the rank of its quota group
	requests, capacity, hits uint64
	window                   int64
	at                       int64 // a refund's: the state's at its charge wrote
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
	e := item{key: key, alg: uint8(it.Limit.Algorithm), mode: uint8(it.Mode), requests: it.Limit.Requests,
		capacity: it.Limit.Capacity(), hits: it.Hits, window: w}
	if it.Hits > e.capacity || (it.Limit.Requests == 0 && it.Hits > 0) {
		e.bits |= bitOver
	}
	if it.Account && it.Hits > 0 {
		e.bits |= bitAccount
	}
	if it.Mode == backend.Quota {
		// The distinct groups before the group's first item.
		var rank uint32
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
		e.group = rank
	}
	return e
}

// scriptCall is one FCALL (or EVALSHA) of a pipeline: the groups of a
// batch that share a slot (all of them on a standalone server). A pipeline
// worker keeps one for its life and reuses it batch after batch (see
// reset), so a batch allocates nothing here but go-redis's command and
// reply.
type scriptCall struct {
	keys   []string
	index  map[string]int // key -> 1-based index into keys
	args   binArg         // ARGV[1]
	groups []*group
	cmd    *onceCmd

	argv []interface{} // the command's arguments (see command)
	once onceCmd       // cmd points here
}

// binArg is the script's binary argument. go-redis writes it through
// MarshalBinary; as a pointer in the command's arguments it costs no
// allocation, where a []byte would be copied into an interface.
type binArg struct{ b []byte }

// MarshalBinary returns the bytes as they are.
func (a *binArg) MarshalBinary() ([]byte, error) { return a.b, nil }

// newScriptCall returns an empty call, with room for requests of items
// in all.
func newScriptCall(requests, items int) *scriptCall {
	return &scriptCall{index: make(map[string]int, items), keys: make([]string, 0, items),
		args: binArg{make([]byte, 0, requestBytes*requests+itemBytes*items)}}
}

// reset empties sc for another batch, keeping its storage. It drops the
// references to the last batch's keys, groups and reply.
func (sc *scriptCall) reset() {
	clear(sc.keys)
	sc.keys = sc.keys[:0]
	clear(sc.index)
	sc.args.b = sc.args.b[:0]
	clear(sc.groups)
	sc.groups = sc.groups[:0]
	clear(sc.argv)
	sc.argv = sc.argv[:0]
	sc.cmd, sc.once = nil, onceCmd{}
}

// add appends the request part g (with the call's now: -1 for Redis's
// TIME) to sc.
func (sc *scriptCall) add(g *group, now int64, whole bool) {
	sc.groups = append(sc.groups, g)
	n := int32(len(g.items))
	if !whole {
		n = -n
	}
	le := binary.LittleEndian
	b := slices.Grow(sc.args.b, requestBytes+(itemBytes+8)*len(g.items))
	b = le.AppendUint64(b, math.Float64bits(float64(now)))
	b = le.AppendUint32(b, uint32(n))
	for i := range g.items {
		it := &g.items[i]
		ki, ok := sc.index[it.key]
		if !ok {
			sc.keys = append(sc.keys, it.key)
			ki = len(sc.keys)
			sc.index[it.key] = ki
		}
		b = le.AppendUint32(b, uint32(ki))
		b = append(b, it.alg, it.mode, it.bits)
		b = le.AppendUint32(b, it.group)
		b = le.AppendUint64(b, math.Float64bits(float64(it.requests)))
		b = le.AppendUint64(b, math.Float64bits(float64(it.window)))
		b = le.AppendUint64(b, math.Float64bits(float64(it.capacity)))
		b = le.AppendUint64(b, math.Float64bits(float64(it.hits)))
		if it.bits&bitRefund != 0 {
			b = le.AppendUint64(b, math.Float64bits(float64(it.at)))
		}
	}
	sc.args.b = b
}

// command returns sc as an FCALL command, or with evalsha as an EVALSHA
// one, or with source as an EVAL. Its arguments live in sc (argv) and are
// written by go-redis before sc changes again. The first key is a string,
// from which a Cluster client takes the slot; the others are pointers to
// sc's keys, which go-redis writes as the strings they point to without
// the allocation that a string in an interface costs.
func (sc *scriptCall) command(ctx context.Context, evalsha, source bool) *onceCmd {
	clear(sc.argv)
	args := slices.Grow(sc.argv[:0], 4+len(sc.keys))
	switch {
	case source:
		args = append(args, "eval", evalCodeArg)
	case evalsha:
		args = append(args, "evalsha", evalScript.Hash())
	default:
		args = append(args, "fcall", functionNameArg)
	}
	args = append(args, len(sc.keys))
	for i := range sc.keys {
		if i == 0 {
			args = append(args, sc.keys[0])
		} else {
			args = append(args, &sc.keys[i])
		}
	}
	args = append(args, &sc.args)
	sc.argv = args
	sc.once = onceCmd{goredis.NewIntSliceCmd(ctx, args...)}
	return &sc.once
}

// onceCmd is a script call that go-redis never sends again on its own: a
// Cluster client re-sends a pipeline whose connection timed out or broke
// (MOVED and ASK redirects still work), but a script sent to a frozen
// server may still run when it resumes, and sent again it would charge
// twice. Whether a failed call ran is the store's business (see
// Store.degrade and mayHaveRun).
type onceCmd struct{ *goredis.IntSliceCmd }

// NoRetry tells go-redis not to re-send the pipeline that holds the call.
func (*onceCmd) NoRetry() bool { return true }

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
		n := g.replyLen()
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
	if len(g.reply) != g.replyLen() {
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

// nowArg is ARGV's now for a store with clock (nil: -1, Redis's TIME).
func nowArg(clock backend.Clock) int64 {
	if clock == nil {
		return -1
	}
	return max(clock.Now().UnixMicro(), 0)
}
