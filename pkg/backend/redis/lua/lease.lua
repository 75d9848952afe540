-- lease.lua: the chunks of consistency lease (see lease.go), one key per
-- call, in the state formats of state.lua (which it does not include: it
-- reads and writes fixed_window, sliding_window_counter, token_bucket and
-- gcra states only).
--
-- KEYS[1]: the state key (KEYS[2]: see token_bucket below). ARGV: op (1 reserve, 2 return), algorithm,
-- requests, window (µs), capacity, n (hits wanted, or unused to return),
-- cs (return: the window start the chunk was granted in), now (µs, or -1
-- for Redis's TIME), instances (active on the limit, at least 1).
--
-- Reserve grants g = min(n, floor(left / (2 * instances))) hits, where left
-- is what the limit allows right now, and charges them as hits: the
-- state never shows more than the limit, whatever the chunks outstanding.
-- A grant of less than 2 is 0 (the last hits are decided strict, exactly).
-- Reply: {g, left after g, window start (µs; now for a bucket), µs until
-- the chunk's window ends (a bucket: until its tokens are held), now}.
--
-- Return gives back n unused hits of a chunk granted in window cs (a
-- window's count is taken down only in that window, or as the previous
-- window of a sliding counter; a bucket's held tokens go back while they
-- are held). Reply: {hits given back, 0, 0, 0, now}.

local FIXED, BUCKET, COUNTER, GCRA = 0, 1, 3, 4
local MAGIC = 240
local TEST_TTL_SLACK_MS = 3600000

local key = KEYS[1]
local op, alg, req, w, cap, n, cs, now, inst =
	tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]),
	tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
local slack = 0
if now < 0 then
	local t = redis.call("TIME")
	now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
	slack = TEST_TTL_SLACK_MS
end
if inst < 1 then
	inst = 1
end
local floor, ceil = math.floor, math.ceil

local at, cnt, prev, level = 0, 0, 0, 0
local v = redis.call("GET", key)
if v and string.byte(v, 1) == MAGIC + alg then
	local _
	if alg == COUNTER and #v == 25 then
		_, at, cnt, prev = struct.unpack("<Bddd", v)
	elseif alg == FIXED and #v == 17 then
		_, at, cnt = struct.unpack("<Bdd", v)
	elseif (alg == BUCKET or alg == GCRA) and #v == 17 then
		_, at, level = struct.unpack("<Bdd", v)
	end
end

-- set writes the state with a TTL of ttl_us rounded up to the millisecond,
-- at least 1 ms and saturated at algorithms.Never, as apply.lua's: every
-- key written has a finite positive TTL, whatever the charge.
local MAX_TTL_MS = 9223372036854
local function set(val, ttl_us)
	local ms = ceil(ttl_us / 1000)
	if not (ms >= 1) then
		ms = 1
	end
	if not (ms < MAX_TTL_MS) then
		ms = MAX_TTL_MS
	end
	redis.call("SET", key, val, "PX", ms + slack)
end

local function keep(val)
	if not redis.pcall("SET", key, val, "KEEPTTL").err then
		return
	end
	local ms = redis.call("PTTL", key)
	if ms > 0 then
		redis.call("SET", key, val, "PX", ms)
	end
end

local function grant(left)
	local g = floor(left / (2 * inst))
	if g > n then
		g = n
	end
	if g < 2 then
		return 0
	end
	return g
end

if alg == FIXED then
	local start = now - math.fmod(now, w)
	if start < at then
		start = at
	end
	local count = 0
	if start == at then
		count = cnt
	end
	if op == 2 then
		if start ~= cs or count == 0 then
			return {0, 0, 0, 0, now}
		end
		local back = n
		if back > count then
			back = count
		end
		count = count - back
		if count == 0 then
			redis.call("DEL", key)
		else
			keep(struct.pack("<Bdd", MAGIC + alg, at, count))
		end
		return {back, 0, 0, 0, now}
	end
	local left = req - count
	if left < 0 then
		left = 0
	end
	local g = grant(left)
	local tte = start + w - now
	if g > 0 then
		set(struct.pack("<Bdd", MAGIC + alg, start, count + g), tte)
	end
	return {g, left - g, start, tte, now}
end

if alg == COUNTER then
	local start = now - math.fmod(now, w)
	if start < at then
		start = at
	end
	local cur, pv = 0, 0
	if start == at then
		cur, pv = cnt, prev
	elseif start - w == at then
		pv = cnt
	end
	if op == 2 then
		local back = n
		if start == cs then
			if back > cur then
				back = cur
			end
			cur = cur - back
		elseif start - w == cs then
			if back > pv then
				back = pv
			end
			pv = pv - back
		else
			return {0, 0, 0, 0, now}
		end
		if back == 0 then
			return {0, 0, 0, 0, now}
		end
		if cur == 0 and pv == 0 then
			redis.call("DEL", key)
		else
			-- The state as of window start (at == start keeps its meaning).
			keep(struct.pack("<Bddd", MAGIC + alg, start, cur, pv))
		end
		return {back, 0, 0, 0, now}
	end
	local elapsed = now - start
	local used = pv * (w - elapsed) + cur * w
	local left = floor((req * w - used) / w)
	if left > req - cur then
		left = req - cur
	end
	if left < 0 then
		left = 0
	end
	local g = grant(left)
	if g > 0 then
		set(struct.pack("<Bddd", MAGIC + alg, start, cur + g, pv), 2 * w - elapsed)
	end
	return {g, left - g, start, w - elapsed, now}
end

-- token_bucket and gcra: debt in token·µs, and the tokens held by chunks,
-- which do not refill while held (the state's fourth and fifth numbers:
-- held, and the instant until which they are held; see bucket_base in
-- algorithms.lua). KEYS[2], a hash in the same slot, holds each instance's
-- part, "held,until": an instance's part that outlived its until counts as
-- taken (its chunk stopped serving before). ARGV[10]: tokens of this
-- instance's chunk used since it last said (they turn into debt now),
-- ARGV[11]: the instance, ARGV[12]: how long a grant holds (µs).
local used, id, hold = tonumber(ARGV[10]), ARGV[11], tonumber(ARGV[12])
local rate = req
local held, until_ = 0, 0
if #v == 33 and string.byte(v, 1) == MAGIC + alg then
	local _
	_, at, level, held, until_ = struct.unpack("<Bdddd", v)
end
if held > 0 and now >= until_ then
	-- Every part is past its time: all held tokens count as taken then.
	if until_ > at then
		level = level - (until_ - at) * rate
		if level < 0 then
			level = 0
		end
		at = until_
	end
	level, held, until_ = level + held * w, 0, 0
end
if now < at then
	now = at
end
local debt = level - (now - at) * rate
if debt < 0 then
	debt = 0
end
-- The parts: drop those past their time (taken), find this instance's.
-- The parts mean something only while the state holds tokens (a strict
-- call or this one may have turned them all into debt).
local mine, parts, live = 0, {}, 0
if held > 0 then
	parts = redis.call("HGETALL", KEYS[2])
else
	redis.call("DEL", KEYS[2])
end
for j = 1, #parts, 2 do
	local f, h, u = parts[j], string.match(parts[j + 1], "^([^,]+),(.+)$")
	h, u = tonumber(h), tonumber(u)
	if f == id then
		if u > now then
			mine = h
		else
			debt, held = debt + h * w, held - h
		end
		redis.call("HDEL", KEYS[2], f)
	elseif u <= now then
		debt, held = debt + h * w, held - h
		redis.call("HDEL", KEYS[2], f)
	elseif u > live then
		live = u
	end
end
if held < 0 then
	held = 0
end
-- This instance's used tokens turn into debt now.
if used > mine then
	used = mine
end
debt, held, mine = debt + used * w, held - used, mine - used
local g, back, left = 0, 0, 0
if op == 2 then
	back = n
	if back > mine then
		back = mine
	end
	held, mine = held - back, mine - back
	if held < 0 then
		held = 0
	end
else
	left = floor((cap * w - debt - held * w) / w)
	if left < 0 then
		left = 0
	end
	g = grant(left)
	held, mine = held + g, mine + g
end
local mine_until = now + hold
if mine > 0 then
	redis.call("HSET", KEYS[2], id, string.format("%.17g,%.17g", mine, mine_until))
	if mine_until > live then
		live = mine_until
	end
end
until_ = live
if held <= 0 or until_ <= now then
	held, until_ = 0, 0
end
if held > 0 then
	redis.call("PEXPIRE", KEYS[2], ceil((until_ - now) / 1000) + 1 + slack)
	set(struct.pack("<Bdddd", MAGIC + alg, now, debt, held, until_), (until_ - now) + (debt + held * w) / rate)
elseif debt > 0 then
	redis.call("DEL", KEYS[2])
	set(struct.pack("<Bdd", MAGIC + alg, now, debt), debt / rate)
else
	redis.call("DEL", KEYS[1], KEYS[2])
end
if op == 2 then
	return {back, 0, 0, 0, now}
end
return {g, left - g, now, hold, now}
