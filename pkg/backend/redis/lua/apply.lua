-- apply.lua decides the items of one envoy-rls request (or of one cluster
-- slot of it) atomically. It is the Lua twin of backend.Transact (load the
-- states, decide every item in order, commit or report checks) and of
-- pkg/algorithms, with the same formulas in the same order, so both stores
-- give identical decisions; a change to either must be made to this script
-- too. Lua numbers are doubles: every count, limit and instant is exact below
-- 2^53.
--
-- The arguments, the reply and the state layouts are specified in
-- ../script.go, which encodes and decodes them. In short:
--
-- KEYS     the distinct state keys of the items, all in one cluster slot.
-- ARGV[1]  now in µs since the Unix epoch, or "" to read Redis's own TIME.
-- ARGV[2]  "1": backend.WholeRequest; "0": backend.PartOfRequest.
-- ARGV[3]  ITEM_FIELDS numbers per item, separated by spaces: key index
--          (1-based into KEYS), algorithm, requests, window µs, capacity,
--          hits, mode, group, over.
--
-- Returns {committed, then per item: allowed, remaining, retry_after,
-- reset_after}.
--
-- The constants below are copies of Go's (algorithms.Kind, backend.Mode,
-- algorithms.Never, the layout); TestScriptConstantsMatchGo fails when they
-- differ.

local FIXED, BUCKET, LOG, COUNTER, GCRA = 0, 1, 2, 3, 4
local ENFORCED, SHADOW, QUOTA = 0, 1, 2
local ITEM_FIELDS = 9
local NEVER = -1
-- algorithms.Never in µs: math.MaxInt64 ns / 1000.
local NEVER_US = 9223372036854775
local EXACT = 9007199254740992 -- 2^53
local MAX_U64 = 18446744073709551616 -- 2^64, math.MaxUint64 as a double

local floor, ceil, fmod = math.floor, math.ceil, math.fmod

-- micros mirrors algorithms.micros: µs to a duration, saturating at Never.
local function micros(us)
	if us <= 0 then
		return 0
	end
	if us >= NEVER_US then
		return NEVER
	end
	return us
end

-- ceil_micros mirrors algorithms.ceilMicros.
local function ceil_micros(us)
	if not (us > 0) then
		return 0
	end
	if us >= NEVER_US then
		return NEVER
	end
	return micros(ceil(us))
end

-- floor_u mirrors algorithms.floorU (saturating at 2^64, which the reply
-- encodes as math.MaxUint64).
local function floor_u(f)
	if not (f > 0) then
		return 0
	end
	if f >= MAX_U64 then
		return MAX_U64
	end
	return floor(f)
end

local function sub0(a, b)
	if b > a then
		return 0
	end
	return a - b
end

local now
if ARGV[1] ~= "" then
	now = tonumber(ARGV[1])
else
	local t = redis.call("TIME")
	now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
if now < 0 then
	now = 0
end
local injected = ARGV[1] ~= ""
local whole = ARGV[2] == "1"

-- The items.
local items = {}
do
	local f = {}
	for tok in string.gmatch(ARGV[3], "%S+") do
		f[#f + 1] = tonumber(tok)
	end
	if #f % ITEM_FIELDS ~= 0 then
		error("envoy-rls: malformed items")
	end
	for i = 0, #f / ITEM_FIELDS - 1 do
		local b = i * ITEM_FIELDS
		local it = {
			ki = f[b + 1], alg = f[b + 2], requests = f[b + 3], w = f[b + 4],
			cap = f[b + 5], hits = f[b + 6], mode = f[b + 7], group = f[b + 8],
			over = f[b + 9] == 1,
		}
		if it.alg ~= FIXED and it.alg ~= BUCKET and it.alg ~= LOG and it.alg ~= COUNTER and it.alg ~= GCRA then
			error("envoy-rls: unknown algorithm " .. tostring(it.alg))
		end
		if it.mode ~= ENFORCED and it.mode ~= SHADOW and it.mode ~= QUOTA then
			error("envoy-rls: unknown mode " .. tostring(it.mode))
		end
		items[i + 1] = it
	end
end

-- Log entries read from Redis, per key index: entries[ki][i] = {at, hits}.
local entries = {}

-- load reads the state of key index ki for algorithm alg.
local function load(ki, alg)
	local key = KEYS[ki]
	if alg == LOG then
		local n = redis.call("LLEN", key)
		if n == 0 then
			return { ki = ki, at = 0, count = 0, m = 0, drop = 0, pushed = {}, exists = false }
		end
		local a, c = string.match(redis.call("LINDEX", key, -1), "^(%S+) (%S+)$")
		if not a then
			error("envoy-rls: malformed log header of " .. key)
		end
		return { ki = ki, at = tonumber(a), count = tonumber(c), m = n - 1, drop = 0, pushed = {}, exists = true }
	end
	local v = redis.call("GET", key)
	if not v then
		return { at = 0, count = 0, prev = 0, level = 0 }
	end
	local a, c, p, l = string.match(v, "^(%S+) (%S+) (%S+) (%S+)$")
	if not a then
		error("envoy-rls: malformed state of " .. key)
	end
	return { at = tonumber(a), count = tonumber(c), prev = tonumber(p), level = tonumber(l) }
end

-- stored returns entry i (1-based) of the log stored at key index ki, which
-- holds m entries, reading them from Redis in chunks.
local function stored(ki, m, i)
	local c = entries[ki]
	if c == nil then
		c = {}
		entries[ki] = c
	end
	local e = c[i]
	if e == nil then
		local lo = i - 1
		local hi = lo + 63
		if hi > m - 1 then
			hi = m - 1
		end
		local r = redis.call("LRANGE", KEYS[ki], lo, hi)
		for j = 1, #r do
			local a, h = string.match(r[j], "^(%S+) (%S+)$")
			if not a then
				error("envoy-rls: malformed log entry of " .. KEYS[ki])
			end
			c[lo + j] = { tonumber(a), tonumber(h) }
		end
		e = c[i]
	end
	return e
end

-- A log state is the stored entries followed by the pushed ones, of which
-- the first drop are gone.
local function log_len(s)
	return s.m + #s.pushed - s.drop
end

local function log_at(s, i)
	local j = s.drop + i
	if j <= s.m then
		return stored(s.ki, s.m, j)
	end
	return s.pushed[j - s.m]
end

-- A decision is {allowed, remaining, retry_after, reset_after}.

-- Each algorithm takes over = hits > capacity (exact, from Go).

local function fixed_window(l, s, now, hits, over)
	local w = l.w
	local start = now - fmod(now, w)
	if start < s.at then -- the clock stepped back into an earlier window
		start = s.at
		if now < s.at then
			now = s.at
		end
	end
	local count = 0
	if start == s.at then
		count = s.count
	end
	local limit = l.requests
	local left = sub0(limit, count)
	local e = micros(w - (now - start))
	if over or hits > left then
		local d = { false, left, e, e }
		if over then
			d[3] = NEVER
		end
		if count == 0 then
			d[4] = 0
		end
		return s, d
	end
	count = count + hits
	local d = { true, limit - count, 0, 0 }
	if count > 0 then
		d[4] = e
	end
	return { at = start, count = count, prev = 0, level = 0 }, d
end

-- floor_div mirrors algorithms.floorDiv: floor(num/den) clamped to [0, max];
-- a zero den gives max.
local function floor_div(num, den, max)
	local q = floor(num / den)
	if not (q < max) then
		return max
	end
	if not (q > 0) then
		return 0
	end
	return q
end

-- sliding_counter mirrors algorithms.slidingCounter, in hits scaled by the
-- window (hit·µs).
local function sliding_counter(l, s, now, hits, over)
	local w = l.w
	local start = now - fmod(now, w)
	if start < s.at then
		start = s.at
		if now < s.at then
			now = s.at
		end
	end
	local cur, prev = 0, 0
	if start == s.at then
		cur, prev = s.count, s.prev
	elseif start - w == s.at then
		prev = s.count
	end
	local elapsed = now - start
	local fw = w
	local full = l.requests * fw
	local used = prev * (w - elapsed) + cur * fw
	local reset = 0
	if cur > 0 then
		reset = 2 * w - elapsed
	elseif prev > 0 then
		reset = w - elapsed
	end
	if over or hits > sub0(l.requests, cur) or used + hits * fw > full then
		local d = { false, floor_u((full - used) / fw), 0, micros(reset) }
		if over then
			d[3] = NEVER
		elseif hits <= sub0(l.requests, cur) then
			-- Within this window, once enough of the previous one slides out.
			local need = (l.requests - cur - hits) * fw
			local e = w - floor_div(need, prev, w)
			d[3] = micros(e - elapsed)
		else
			-- In the next window, where this window's count becomes prev.
			local need = (l.requests - hits) * fw
			local e = w - floor_div(need, cur, w)
			d[3] = micros(w + e - elapsed)
		end
		return s, d
	end
	cur = cur + hits
	used = used + hits * fw
	if hits > 0 then
		reset = 2 * w - elapsed
	end
	return { at = start, count = cur, prev = prev, level = 0 }, { true, floor_u((full - used) / fw), 0, micros(reset) }
end

-- bucket mirrors algorithms.bucket, which decides token_bucket and gcra: the
-- state is the last update and the debt in token·µs.
local function bucket(l, s, now, hits, over)
	if now < s.at then -- the clock stepped back
		now = s.at
	end
	local capacity = l.cap
	local fw, rate = l.w, l.requests
	local full = capacity * fw
	local debt = s.level - (now - s.at) * rate
	if debt < 0 then
		debt = 0
	end
	local need = debt + hits * fw
	if over or need > full then
		local d = { false, floor_u((full - debt) / fw), NEVER, ceil_micros(debt / rate) }
		if not over then
			d[3] = ceil_micros((need - full) / rate)
		end
		return s, d
	end
	return { at = now, count = 0, prev = 0, level = need },
		{ true, floor_u((full - need) / fw), 0, ceil_micros(need / rate) }
end

local function sliding_log(l, s, now, hits, over)
	local w = l.w
	if now < s.at then
		now = s.at
	end
	local v = { ki = s.ki, at = s.at, count = s.count, m = s.m, drop = s.drop, pushed = s.pushed, exists = s.exists }
	local count = s.count
	while log_len(v) > 0 and log_at(v, 1)[1] <= now - w do
		count = count - log_at(v, 1)[2]
		v.drop = v.drop + 1
	end
	local limit = l.requests
	local left = sub0(limit, count)
	if over or hits > left then
		local d = { false, left, 0, 0 }
		local n = log_len(v)
		if n > 0 then
			d[4] = micros(log_at(v, n)[1] + w - now)
		end
		if over then
			d[3] = NEVER
		else
			local need, freed = hits - left, 0
			for i = 1, n do
				local e = log_at(v, i)
				freed = freed + e[2]
				if freed >= need then
					d[3] = micros(e[1] + w - now)
					break
				end
			end
		end
		return s, d
	end
	if hits > 0 then
		local p = {}
		for i = 1, #s.pushed do
			p[i] = s.pushed[i]
		end
		p[#p + 1] = { now, hits }
		v.pushed = p
		count = count + hits
	end
	v.at, v.count = now, count
	local d = { true, limit - count, 0, 0 }
	local n = log_len(v)
	if n > 0 then
		d[4] = micros(log_at(v, n)[1] + w - now)
	end
	return v, d
end

-- decide mirrors algorithms.DecideMicros.
local function decide(it, s, now, hits, over)
	if it.requests == 0 then
		if hits == 0 then
			return s, { true, 0, 0, 0 }
		end
		return s, { false, 0, NEVER, 0 }
	end
	local alg = it.alg
	if alg == BUCKET or alg == GCRA then
		return bucket(it, s, now, hits, over)
	elseif alg == LOG then
		return sliding_log(it, s, now, hits, over)
	elseif alg == COUNTER then
		return sliding_counter(it, s, now, hits, over)
	end
	return fixed_window(it, s, now, hits, over)
end

local function num(x)
	return string.format("%.17g", x)
end

-- save writes the state s of key index ki, whose ResetAfter is reset (µs or
-- NEVER).
local function save(ki, alg, s, reset)
	local key = KEYS[ki]
	if reset == 0 then
		redis.call("DEL", key) -- the state is fresh: keep nothing
		return
	end
	local ms = nil
	if not injected and reset ~= NEVER then
		ms = ceil(reset / 1000)
	end
	if alg ~= LOG then
		local v = num(s.at) .. " " .. num(s.count) .. " " .. num(s.prev) .. " " .. num(s.level)
		if ms then
			redis.call("SET", key, v, "PX", ms)
		else
			redis.call("SET", key, v)
		end
		return
	end
	local header = num(s.at) .. " " .. num(s.count)
	local trim = s.drop
	if trim > s.m then
		trim = s.m
	end
	local new = {}
	for i = s.drop - trim + 1, #s.pushed do
		local e = s.pushed[i]
		new[#new + 1] = num(e[1]) .. " " .. num(e[2])
	end
	if s.exists then
		if trim > 0 then
			redis.call("LTRIM", key, trim, -1)
		end
		if #new > 0 then
			redis.call("RPOP", key)
			new[#new + 1] = header
			redis.call("RPUSH", key, unpack(new))
		else
			redis.call("LSET", key, -1, header)
		end
	else
		new[#new + 1] = header
		redis.call("RPUSH", key, unpack(new))
	end
	if ms then
		redis.call("PEXPIRE", key, ms)
	else
		redis.call("PERSIST", key)
	end
end

-- backend.Transact from here on. Decide every item in order; items of one
-- key see the hits of the allowing ones before them.
local orig, work, algs, charged, reset, dec = {}, {}, {}, {}, {}, {}
for i, it in ipairs(items) do
	local ki = it.ki
	if orig[ki] == nil then
		orig[ki] = load(ki, it.alg)
		work[ki], algs[ki] = orig[ki], it.alg
	elseif algs[ki] ~= it.alg then
		error("envoy-rls: items of key " .. KEYS[ki] .. " use different algorithms")
	end
	local s, d = decide(it, work[ki], now, it.hits, it.over)
	dec[i] = d
	if d[1] then
		work[ki], charged[ki], reset[ki] = s, true, d[4]
	end
end

-- Whether to commit: backend.Verdict for a whole request; for one slot of a
-- split request (backend.PartOfRequest), unless an Enforced item denies.
local commit = true
do
	local groups, quota = {}, false
	for i, it in ipairs(items) do
		if it.mode == ENFORCED then
			if not dec[i][1] then
				commit = false
				break
			end
		elseif it.mode == QUOTA then
			quota = true
			groups[it.group] = groups[it.group] or not dec[i][1]
		end
	end
	if commit and whole and quota then
		commit = false
		for _, denied in pairs(groups) do
			if not denied then
				commit = true
				break
			end
		end
	end
end

if commit then
	for ki, _ in pairs(charged) do
		save(ki, algs[ki], work[ki], reset[ki])
	end
else
	-- Nothing is charged: report the allowing items' state as it stays.
	for i, it in ipairs(items) do
		if dec[i][1] then
			local _, d = decide(it, orig[it.ki], now, 0, false)
			dec[i] = d
		end
	end
end

local function count_reply(x)
	if x < EXACT then
		return x
	end
	if x >= MAX_U64 then
		return "18446744073709551615"
	end
	return string.format("%.0f", x)
end

local out = { commit and 1 or 0 }
for i = 1, #items do
	local d = dec[i]
	out[#out + 1] = d[1] and 1 or 0
	out[#out + 1] = count_reply(d[2])
	out[#out + 1] = d[3]
	out[#out + 1] = d[4]
end
return out
