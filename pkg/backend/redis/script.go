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

//go:embed lua/apply.lua
var applyLua string

// applyScript is the one script that decides a request's items: see
// lua/apply.lua.
var applyScript = goredis.NewScript(applyLua)

// makeGroup encodes the items idx (with Redis keys keys) as one script call.
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
var errReply = errors.New("redis: unexpected reply from the redis script")

// decodeReply writes the decisions of g's items into out.
func decodeReply(g *group, items []backend.Item, out []algorithms.Decision) error {
	if g.cmd == nil {
		return errReply
	}
	v, err := g.cmd.Result()
	if err != nil {
		return fmt.Errorf("redis: redis: %w", err)
	}
	a, ok := v.([]interface{})
	if !ok || len(a) != 1+4*len(g.idx) {
		return fmt.Errorf("%w: %T of %d values for %d items", errReply, v, len(a), len(g.idx))
	}
	for k, i := range g.idx {
		f := a[1+4*k : 5+4*k]
		allowed, ok1 := f[0].(int64)
		remaining, ok2 := replyCount(f[1])
		retry, ok3 := replyDuration(f[2])
		reset, ok4 := replyDuration(f[3])
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
