-- lease.lua: the chunks of consistency lease (see lease.go), one key per
-- call, in the state formats of state.lua (which it does not include: it
-- reads and writes fixed_window, sliding_window_counter, token_bucket and
-- gcra states only).
--
-- KEYS[1]: the state key. ARGV: op (1 reserve, 2 return), algorithm,
-- requests, window (µs), capacity, n (hits wanted, or unused to return),
-- cs (return: the window start the chunk was granted in), now (µs, or -1
-- for Redis's TIME), instances (active on the limit, at least 1).
--
-- Reserve grants g = min(n, floor(left / (2 * instances))) hits, where left
-- is what the limit allows right now, and charges them as hits: the
-- state never shows more than the limit, whatever the chunks outstanding.
-- A grant of less than 2 is 0 (the last hits are decided strict, exactly).
-- Reply: {g, left after g, window start (µs; now for a bucket), µs until
-- the chunk's window ends (0 for a bucket), now}.
--
-- Return gives back n unused hits of a chunk granted in window cs (a
-- window's count is taken down only in that window, or as the previous
-- window of a sliding counter; a bucket's debt is credited, never below
-- zero). Reply: {hits given back, 0, 0, 0, now}.

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

local function set(val, ttl_us)
	local ms = ceil(ttl_us / 1000)
	if ms < 1 then
		ms = 1
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

-- token_bucket and gcra: debt in token·µs.
if now < at then
	now = at
end
local rate = req
local debt = level - (now - at) * rate
if debt < 0 then
	debt = 0
end
if op == 2 then
	local back = n
	if back * w > debt then
		back = floor(debt / w)
	end
	debt = debt - n * w
	if debt <= 0 then
		redis.call("DEL", key)
	else
		set(struct.pack("<Bdd", MAGIC + alg, now, debt), debt / rate)
	end
	return {back, 0, 0, 0, now}
end
local left = floor((cap * w - debt) / w)
if left < 0 then
	left = 0
end
local g = grant(left)
if g > 0 then
	debt = debt + g * w
	set(struct.pack("<Bdd", MAGIC + alg, now, debt), debt / rate)
end
return {g, left - g, now, 0, now}
