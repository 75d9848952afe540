package rlqs

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// Redis keeps each bucket's shares in one hash, prefix + "rlqs:" + the
// bucket's key, with one field per subscriber:
//
//	want|rate|prev|lowered_ms|expires_ms|seen_until_ms|closed|grace_ms|host
//
// Every read and write is a script that takes the time from Redis's TIME,
// so instances with skewed clocks agree on what has expired, and that
// decides one bucket atomically: however many instances reserve at once,
// each raise comes out of what the others hold. The hash expires when its
// last entry does.

// redisState is the Lua shared by the scripts: the time and the parsing of
// an entry.
const redisState = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function parse(v)
  local p, i = {}, 1
  for n = 1, 8 do
    local j = string.find(v, '|', i, true)
    p[n] = tonumber(string.sub(v, i, j - 1))
    i = j + 1
  end
  p[9] = string.sub(v, i)
  return p
end
local function held(p)
  if now - p[4] < p[8] then return math.max(p[2], p[3]) end
  return p[2]
end
local function fmt(x) return string.format('%.17g', x) end
`

// redisLoad returns, for KEYS[1], the live and gone entries as
// sub, host, want, held rate, gone (1 or 0), dropping expired ones.
var redisLoad = goredis.NewScript(redisState + `
local all = redis.call('HGETALL', KEYS[1])
local out = {}
for i = 1, #all, 2 do
  local p = parse(all[i + 1])
  if now >= p[5] then
    redis.call('HDEL', KEYS[1], all[i])
  else
    local gone = 0
    if p[7] == 1 or now >= p[6] then gone = 1 end
    out[#out + 1] = all[i]
    out[#out + 1] = p[9]
    out[#out + 1] = fmt(p[1])
    out[#out + 1] = fmt(held(p))
    out[#out + 1] = tostring(gone)
  end
end
return out
`)

// redisReserve grants one subscriber its share of KEYS[1] and returns the
// tokens. ARGV: sub, host, want, target, cap, fill, ttl ms, stale ms,
// grace ms, takeover (sub or ""), expiry margin ms.
var redisReserve = goredis.NewScript(redisState + `
local sub, host = ARGV[1], ARGV[2]
local want, target, cap, fill = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local ttl, stale, grace, takeover = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9]), ARGV[10]
local margin = tonumber(ARGV[11])
local all = redis.call('HGETALL', KEYS[1])
local others, me, took = 0, nil, nil
for i = 1, #all, 2 do
  local f, p = all[i], parse(all[i + 1])
  if now >= p[5] then
    redis.call('HDEL', KEYS[1], f)
  elseif f == sub then
    me = p
  elseif f == takeover and p[9] == host and (p[7] == 1 or now >= p[6]) then
    took = p[2]
    redis.call('HDEL', KEYS[1], f)
  else
    others = others + held(p)
  end
end
local g = math.min(target, math.max(cap - others, 0))
local tokens = 0
if g > 0 and fill > 0 then
  tokens = math.min(math.floor(g * fill + 1e-9), 4294967295)
end
local rate = 0
if fill > 0 then rate = tokens / fill end
local prev, lowered = 0, 0
if me then
  prev, lowered = me[3], me[4]
  if rate < me[2] then prev, lowered = me[2], now end
elseif took and took > rate then
  prev, lowered = took, now
end
redis.call('HSET', KEYS[1], sub, fmt(want) .. '|' .. fmt(rate) .. '|' .. fmt(prev) .. '|' .. lowered .. '|' ..
  (now + ttl + margin) .. '|' .. (now + stale) .. '|0|' .. grace .. '|' .. host)
local pttl = redis.call('PTTL', KEYS[1])
if pttl < ttl + margin then redis.call('PEXPIRE', KEYS[1], ttl + margin) end
return tokens
`)

// redisRelease marks a subscriber of KEYS[1] gone (ARGV: sub, drop 1 or
// 0); a dropped one holds its rate for its grace only.
var redisRelease = goredis.NewScript(redisState + `
local v = redis.call('HGET', KEYS[1], ARGV[1])
if not v then return 0 end
local p = parse(v)
if ARGV[2] == '1' then
  p[3], p[4], p[2] = held(p), now, 0
  p[5] = math.min(p[5], now + p[8])
end
redis.call('HSET', KEYS[1], ARGV[1], fmt(p[1]) .. '|' .. fmt(p[2]) .. '|' .. fmt(p[3]) .. '|' .. p[4] .. '|' ..
  p[5] .. '|' .. p[6] .. '|1|' .. p[8] .. '|' .. p[9])
return 1
`)

// redisShares are Shares in Redis.
type redisShares struct {
	c      goredis.UniversalClient
	prefix string
}

// NewRedisShares returns Shares kept in Redis through c, under keys that
// start with prefix (the --key-prefix of the counters), shared by every
// instance that uses the same Redis and prefix.
func NewRedisShares(c goredis.UniversalClient, prefix string) Shares {
	return &redisShares{c: c, prefix: prefix}
}

func (r *redisShares) key(k string) string { return r.prefix + "rlqs:" + k }

func ms(d time.Duration) int64 { return d.Milliseconds() }

// run sends one script call per element in one pipeline; when Redis does
// not have a script yet, it loads the scripts and sends the calls again.
func (r *redisShares) run(ctx context.Context, n int, call func(p goredis.Pipeliner, i int) *goredis.Cmd) ([]*goredis.Cmd, error) {
	for attempt := 0; ; attempt++ {
		cmds := make([]*goredis.Cmd, n)
		_, err := r.c.Pipelined(ctx, func(p goredis.Pipeliner) error {
			for i := range n {
				cmds[i] = call(p, i)
			}
			return nil
		})
		if err != nil && attempt == 0 && isNoScript(err, cmds) {
			for _, s := range []*goredis.Script{redisLoad, redisReserve, redisRelease} {
				if err := s.Load(ctx, r.c).Err(); err != nil {
					return nil, err
				}
			}
			continue
		}
		if err != nil {
			return nil, err
		}
		return cmds, nil
	}
}

func isNoScript(err error, cmds []*goredis.Cmd) bool {
	if goredis.HasErrorPrefix(err, "NOSCRIPT") {
		return true
	}
	for _, c := range cmds {
		if c != nil && goredis.HasErrorPrefix(c.Err(), "NOSCRIPT") {
			return true
		}
	}
	return false
}

func (r *redisShares) Load(ctx context.Context, keys []string) ([][]Entry, error) {
	cmds, err := r.run(ctx, len(keys), func(p goredis.Pipeliner, i int) *goredis.Cmd {
		return redisLoad.EvalSha(ctx, p, []string{r.key(keys[i])})
	})
	if err != nil {
		return nil, err
	}
	out := make([][]Entry, len(keys))
	for i, c := range cmds {
		vals, err := c.StringSlice()
		if err != nil {
			return nil, fmt.Errorf("rlqs shares: load reply: %w", err)
		}
		if len(vals)%5 != 0 {
			return nil, errors.New("rlqs shares: load reply of " + strconv.Itoa(len(vals)) + " fields")
		}
		for j := 0; j < len(vals); j += 5 {
			want, err1 := strconv.ParseFloat(vals[j+2], 64)
			rate, err2 := strconv.ParseFloat(vals[j+3], 64)
			if err := errors.Join(err1, err2); err != nil {
				return nil, fmt.Errorf("rlqs shares: load reply: %w", err)
			}
			out[i] = append(out[i], Entry{Sub: vals[j], Host: vals[j+1], Want: want, Rate: rate, Gone: vals[j+4] == "1"})
		}
	}
	return out, nil
}

func (r *redisShares) Reserve(ctx context.Context, rs []Reservation, out []int64) error {
	cmds, err := r.run(ctx, len(rs), func(p goredis.Pipeliner, i int) *goredis.Cmd {
		x := &rs[i]
		grace := x.Grace
		if grace <= 0 {
			grace = loweredGrace
		}
		return redisReserve.EvalSha(ctx, p, []string{r.key(x.Key)}, x.Sub, safeHost(x.Host),
			strconv.FormatFloat(x.Want, 'g', -1, 64), strconv.FormatFloat(x.Target, 'g', -1, 64),
			strconv.FormatFloat(x.Cap, 'g', -1, 64), x.Fill, ms(x.TTL), ms(x.Stale), ms(grace), x.Takeover, ms(loweredGrace))
	})
	if err != nil {
		return err
	}
	for i, c := range cmds {
		n, err := c.Int64()
		if err != nil {
			return fmt.Errorf("rlqs shares: reserve reply: %w", err)
		}
		out[i] = n
	}
	return nil
}

func (r *redisShares) Release(ctx context.Context, rs []Release) error {
	_, err := r.run(ctx, len(rs), func(p goredis.Pipeliner, i int) *goredis.Cmd {
		drop := "0"
		if rs[i].Drop {
			drop = "1"
		}
		return redisRelease.EvalSha(ctx, p, []string{r.key(rs[i].Key)}, rs[i].Sub, drop)
	})
	return err
}

// safeHost keeps a host from holding the entry separator.
func safeHost(h string) string { return strings.ReplaceAll(h, "|", "_") }
