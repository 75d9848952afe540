-- lease.lua: the chunks of consistency lease (see lease.go), many keys per
-- call (on a Cluster, keys of one slot), in the state formats of state.lua
-- (which it does not include: it reads and writes fixed_window,
-- sliding_window_counter, token_bucket and gcra states only).
--
-- ARGV: now (µs, or -1 for Redis's TIME, read once per call), instances
-- (active on the limit, at least 1), the instance (id), hold (µs a bucket's
-- grant holds its tokens), the number of keys; then 9 fields per key: op (1
-- reserve, 2 return), algorithm, requests, window (µs), capacity, n (hits
-- wanted, or unused to return), cs (return: the window start the chunk was
-- granted in), used (a bucket's, see below; 0 otherwise), ah (a reserve of
-- consistency approximate's key: the µs a share of approximate.lua lives
-- after its sync; 0 otherwise). KEYS: per key, in order, its state key, and
-- for token_bucket and gcra the hash beside it (see below), for a window
-- key with ah > 0 approximate.lua's hash of shares beside it.
--
-- A reserve with ah > 0 sees the live shares of that hash (every instance's,
-- see approximate.lua) as taken: chunks, counted hits and shares together
-- never exceed the limit.
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
--
-- The reply of the call is the keys' replies, 5 integers each, in order. A
-- key whose commands failed (a key of another type, say) replies {-1, 0, 0,
-- 0, now}, its effects up to the failure kept, as a failed call's are; the
-- other keys of the call are not affected.

local FIXED, BUCKET, COUNTER, GCRA = 0, 1, 3, 4
local MAGIC = 240
local TEST_TTL_SLACK_MS = 3600000
local FIELDS = 9

local now, inst, id, hold, nk =
	tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
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

-- set writes a state with a TTL of ttl_us rounded up to the millisecond,
-- at least 1 ms and saturated at algorithms.Never, as apply.lua's: every
-- key written has a finite positive TTL, whatever the charge.
local MAX_TTL_MS = 9223372036854
local function set(key, val, ttl_us)
	local ms = ceil(ttl_us / 1000)
	if not (ms >= 1) then
		ms = 1
	end
	if not (ms < MAX_TTL_MS) then
		ms = MAX_TTL_MS
	end
	redis.call("SET", key, val, "PX", ms + slack)
end

local function keep(key, val)
	if not redis.pcall("SET", key, val, "KEEPTTL").err then
		return
	end
	local ms = redis.call("PTTL", key)
	if ms > 0 then
		redis.call("SET", key, val, "PX", ms)
	end
end

local function grant(left, n)
	local g = floor(left / (2 * inst))
	if g > n then
		g = n
	end
	if g < 2 then
		return 0
	end
	return g
end

-- shares returns the live shares of approximate.lua's hash hkey held in the
-- window starting at start and in the one before it (ah: µs a share lives
-- after its sync).
local function shares(hkey, ah, start, w)
	local cur, pv = 0, 0
	if ah <= 0 then
		return 0, 0
	end
	local parts = redis.call("HGETALL", hkey)
	for j = 1, #parts, 2 do
		if parts[j] ~= "over" then
			local _, fw, fv, seen = string.match(parts[j + 1], "^([^,]+),([^,]+),([^,]+),(.+)$")
			fw, fv, seen = tonumber(fw), tonumber(fv), tonumber(seen)
			if fw and fv and seen and seen + ah > now then
				if fw == start then
					cur = cur + fv
				elseif fw == start - w then
					pv = pv + fv
				end
			end
		end
	end
	return cur, pv
end

local function fixed(key, hkey, ah, op, alg, req, w, n, cs, at, cnt)
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
			keep(key, struct.pack("<Bdd", MAGIC + alg, at, count))
		end
		return {back, 0, 0, 0, now}
	end
	local held = shares(hkey, ah, start, w)
	local left = req - count - held
	if left < 0 then
		left = 0
	end
	local g = grant(left, n)
	local tte = start + w - now
	if g > 0 then
		set(key, struct.pack("<Bdd", MAGIC + alg, start, count + g), tte)
	end
	return {g, left - g, start, tte, now}
end

local function counter(key, hkey, ah, op, alg, req, w, n, cs, at, cnt, prev)
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
			keep(key, struct.pack("<Bddd", MAGIC + alg, start, cur, pv))
		end
		return {back, 0, 0, 0, now}
	end
	local elapsed = now - start
	-- Shares of the previous window weigh as its hits not counted yet.
	local held, heldPrev = shares(hkey, ah, start, w)
	local used = pv * (w - elapsed) + cur * w
	local left = floor((req * w - used - heldPrev * (w - elapsed)) / w)
	if left > req - cur then
		left = req - cur
	end
	left = left - held
	if left < 0 then
		left = 0
	end
	local g = grant(left, n)
	if g > 0 then
		set(key, struct.pack("<Bddd", MAGIC + alg, start, cur + g, pv), 2 * w - elapsed)
	end
	return {g, left - g, start, w - elapsed, now}
end

-- token_bucket and gcra: debt in token·µs, and the tokens held by chunks,
-- which do not refill while held (the state's fourth and fifth numbers:
-- held, and the instant until which they are held; see bucket_base in
-- algorithms.lua). hkey, a hash in the same slot, holds each instance's
-- part, "held,until": an instance's part that outlived its until counts as
-- taken (its chunk stopped serving before). used: tokens of this
-- instance's chunk used since it last said (they turn into debt now).
local function bucket(key, hkey, op, alg, req, w, cap, n, used, v, at, level)
	local now = now
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
		parts = redis.call("HGETALL", hkey)
	else
		redis.call("DEL", hkey)
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
			redis.call("HDEL", hkey, f)
		elseif u <= now then
			debt, held = debt + h * w, held - h
			redis.call("HDEL", hkey, f)
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
		g = grant(left, n)
		held, mine = held + g, mine + g
	end
	local mine_until = now + hold
	if mine > 0 then
		redis.call("HSET", hkey, id, string.format("%.17g,%.17g", mine, mine_until))
		if mine_until > live then
			live = mine_until
		end
	end
	until_ = live
	if held <= 0 or until_ <= now then
		held, until_ = 0, 0
	end
	if held > 0 then
		redis.call("PEXPIRE", hkey, ceil((until_ - now) / 1000) + 1 + slack)
		set(key, struct.pack("<Bdddd", MAGIC + alg, now, debt, held, until_), (until_ - now) + (debt + held * w) / rate)
	elseif debt > 0 then
		redis.call("DEL", hkey)
		set(key, struct.pack("<Bdd", MAGIC + alg, now, debt), debt / rate)
	else
		redis.call("DEL", key, hkey)
	end
	if op == 2 then
		return {back, 0, 0, 0, now}
	end
	return {g, left - g, now, hold, now}
end

-- one runs the reserve or return of the key whose fields start at ARGV[a]
-- and whose keys at KEYS[k].
local function one(a, k)
	local op, alg, req, w, cap, n, cs, used, ah =
		tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]),
		tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5]), tonumber(ARGV[a + 6]), tonumber(ARGV[a + 7]),
		tonumber(ARGV[a + 8])
	local key = KEYS[k]
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
	if alg == FIXED then
		return fixed(key, KEYS[k + 1], ah, op, alg, req, w, n, cs, at, cnt)
	elseif alg == COUNTER then
		return counter(key, KEYS[k + 1], ah, op, alg, req, w, n, cs, at, cnt, prev)
	end
	return bucket(key, KEYS[k + 1], op, alg, req, w, cap, n, used, v or "", at, level)
end

local out, k = {}, 1
for i = 0, nk - 1 do
	local a = 6 + FIELDS * i
	local alg, ah = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 8])
	local ok, r = pcall(one, a, k)
	if not ok then
		r = {-1, 0, 0, 0, now}
	end
	for j = 1, 5 do
		out[#out + 1] = r[j]
	end
	if alg == BUCKET or alg == GCRA or ah > 0 then
		k = k + 2
	else
		k = k + 1
	end
end
return out
