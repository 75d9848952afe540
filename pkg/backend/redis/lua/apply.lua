-- apply.lua is the Redis side of the Redis store: the Lua twin of
-- pkg/algorithms and of the memory store, with the same formulas in the
-- same order, so both stores give identical decisions. One call decides a
-- batch of requests (on a Cluster, the parts of requests in one hash slot),
-- in order, each one all-or-nothing on its own and seeing the state the
-- ones before it left; each key is read once and written once per call.
-- Lua numbers are doubles: every count, limit and instant is exact below
-- 2^53. Arguments and states are binary (the struct library): a double
-- reads back exactly, so nothing is parsed or formatted as text.
--
-- The layout of KEYS, ARGV, the reply and the stored state is documented
-- in script.go, next to the Go code that writes and reads it. script.go
-- wraps this file two ways: as a function library (FUNCTION LOAD, called
-- with FCALL, where the tables below outlive a call and are reused), and
-- as a script for EVALSHA/EVAL on servers without functions. Either way
-- the entry point is apply(keys, args).

-- Copies of Go's constants (algorithms.Kind, backend.Mode, algorithms.Never,
-- the layout of script.go); TestScriptConstantsMatchGo fails when they
-- differ.
local FIXED, BUCKET, LOG, COUNTER, GCRA = 0, 1, 2, 3, 4
local ENFORCED, SHADOW, QUOTA = 0, 1, 2
local REQUEST_BYTES, ITEM_BYTES = 12, 43
local BIT_OVER, BIT_ACCOUNT = 1, 2
local MAGIC = 240 -- the first byte of a state: MAGIC + the algorithm
local TEST_TTL_SLACK_MS = 3600000 -- added to TTLs under a test's clock (see save)
local NEVER = -1
local NEVER_US = 9223372036854775 -- algorithms.Never in µs
local EXACT = 9007199254740992 -- 2^53
local MAX_U64 = 18446744073709551616 -- 2^64

-- Library functions, bound on the first call: a function library sees
-- no globals but redis while it loads.
local floor, ceil, fmod, tonum, byte, pack, unpack_, unpk, each, fail, call, pcall_, type_

local function bind()
	floor, ceil, fmod = math.floor, math.ceil, math.fmod
	tonum, byte, pack, unpack_ = tonumber, string.byte, struct.pack, struct.unpack
	unpk, each, fail, call, pcall_, type_ = unpack, pairs, error, redis.call, redis.pcall, type
end

-- The binary layouts (see script.go): a request's header, an item, the
-- states and a log's entries.
local F_REQUEST, F_ITEM = "<di4", "<I4BBBI4dddd"
local F_STATE2, F_STATE3, F_ENTRY1, F_ENTRY2 = "<Bdd", "<Bddd", "<d", "<dd"
local K -- the KEYS of the call being run

local function micros(us)
	if us <= 0 then
		return 0
	end
	if us >= NEVER_US then
		return NEVER
	end
	return us
end

local function ceil_micros(us)
	if not (us > 0) then
		return 0
	end
	if us >= NEVER_US then
		return NEVER
	end
	return micros(ceil(us))
end

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

-- Scalar state of a key (every algorithm but the log), as loaded or as
-- charged so far in this batch: the fields of algorithms.State.
local s_at, s_count, s_prev, s_level = {}, {}, {}, {}
-- Log state: header (at, count), the stored entries read so far
-- (l_ent[ki][2i-1], l_ent[ki][2i] = at, hits of entry i), how many are
-- stored (l_m, nil until known), how many of the entries are gone
-- (l_drop), the entries pushed in this batch (l_push, flat at, hits), and
-- whether the key existed.
local l_ent, l_m, l_drop, l_push, l_np, l_exists = {}, {}, {}, {}, {}, {}
-- The at and count a key was loaded with (count 0: fresh). A fixed window
-- or sliding counter key that held a count in the window it is saved in
-- already expires where it should (see save).
local w_at, w_count = {}, {}
-- Per key: its algorithm, the ResetAfter of its last charge (its TTL),
-- and the call (G) in which it was loaded. These tables live as long as
-- the function library (with EVAL, one call), so a call allocates no
-- tables for scalar keys: an entry is valid only when lgen[ki] is the
-- current call's G.
local algs, resets, lgen = {}, {}, {}
local G = 0
-- The values of every key of call G (MGET: a list or another type reads
-- as false), read at the first scalar key's load: one redis.call for the
-- whole batch instead of one GET per key.
local mget, mget_gen = nil, 0
local MGET_MAX = 1000 -- more keys than this: one GET each (Lua's stack)
-- The keys charged in this call, in order (dl[1..dn]), and dgen[ki] == G
-- when ki is among them.
local dl, dgen, dn = {}, {}, 0

-- fresh sets key ki's state to that of a key that does not exist.
local function fresh(ki, alg)
	s_at[ki], s_count[ki], s_prev[ki], s_level[ki] = 0, 0, 0, 0
	if alg == LOG then
		l_drop[ki], l_push[ki], l_np[ki], l_ent[ki], l_m[ki], l_exists[ki] = 0, {}, 0, {}, 0, false
	end
end

-- parse_entry returns at, hits of a log entry (8 bytes: at, hits 1; 16
-- bytes: at, hits), or nil when it is neither.
local function parse_entry(v)
	local n = #v
	if n == 8 then
		return unpack_(F_ENTRY1, v), 1
	elseif n == 16 then
		local at, h = unpack_(F_ENTRY2, v)
		return at, h
	end
	return nil
end

-- read loads key ki's state; it returns false when the key holds something
-- this version cannot read (another type, or an earlier version's format).
local function read(ki, alg)
	local key = K[ki]
	if alg == LOG then
		local r = pcall_("LRANGE", key, 0, 3)
		if r.err then
			return false
		end
		local n = #r
		l_drop[ki], l_push[ki], l_np[ki] = 0, {}, 0
		if n == 0 then
			fresh(ki, alg)
			return true
		end
		local h = r[1]
		if #h ~= 25 or byte(h, 1) ~= MAGIC + LOG then
			return false
		end
		local _
		_, s_at[ki], s_count[ki], s_prev[ki] = unpack_(F_STATE3, h)
		local e = {}
		for j = 2, n do
			local at, hits = parse_entry(r[j])
			if not at then
				return false
			end
			e[2 * j - 3], e[2 * j - 2] = at, hits
		end
		l_ent[ki], l_exists[ki], l_m[ki] = e, true, nil -- every field: the tables outlive calls
		if n < 4 then
			l_m[ki] = n - 1
		end
		return true
	end
	local v
	if #K <= MGET_MAX then
		if mget_gen ~= G then
			mget, mget_gen = call("MGET", unpk(K)), G
		end
		v = mget[ki]
	else
		v = pcall_("GET", key)
	end
	if not v then
		fresh(ki, alg)
		return true
	end
	if type_(v) ~= "string" or byte(v, 1) ~= MAGIC + alg then
		return false -- another type, version or algorithm
	end
	local n, _ = #v
	if alg == COUNTER then
		if n ~= 25 then
			return false
		end
		_, s_at[ki], s_count[ki], s_prev[ki] = unpack_(F_STATE3, v)
		s_level[ki] = 0
	elseif n ~= 17 then
		return false
	elseif alg == FIXED then
		_, s_at[ki], s_count[ki] = unpack_(F_STATE2, v)
		s_prev[ki], s_level[ki] = 0, 0
	else
		_, s_at[ki], s_level[ki] = unpack_(F_STATE2, v)
		s_count[ki], s_prev[ki] = 0, 0
	end
	return true
end

-- load reads key ki's state for algorithm alg. A key this version cannot
-- read is deleted and starts fresh, rather than failing every request of
-- the call: after an upgrade that changed the format, such a key forgets
-- at most one window's hits.
local function load(ki, alg)
	algs[ki], lgen[ki] = alg, G
	if not read(ki, alg) then
		call("DEL", K[ki])
		fresh(ki, alg)
	end
	w_at[ki], w_count[ki] = s_at[ki], s_count[ki]
end

-- entry returns at, hits of stored entry i (1-based) of log key ki, or nil
-- past the end, reading further entries in growing chunks.
local function entry(ki, i)
	local e = l_ent[ki]
	local at = e[2 * i - 1]
	if at then
		return at, e[2 * i]
	end
	local m = l_m[ki]
	if m and i > m then
		return nil
	end
	-- Entries i.. are list indices i.. (the header is index 0).
	local want = i
	if want < 8 then
		want = 8
	elseif want > 256 then
		want = 256
	end
	local r = call("LRANGE", K[ki], i, i + want - 1)
	local n = #r
	for j = 1, n do
		local k = i + j - 1
		local at, hits = parse_entry(r[j])
		if not at then
			fail("envoy-rls: malformed log entry of " .. K[ki])
		end
		e[2 * k - 1], e[2 * k] = at, hits
	end
	if n < want then
		l_m[ki] = i + n - 1
	end
	return e[2 * i - 1], e[2 * i]
end

-- log_at returns at, hits of entry i (1-based) of the log ki after drop
-- entries are gone, or nil past its end.
local function log_at(ki, drop, i)
	local j = drop + i
	local at, h = entry(ki, j)
	if at then
		return at, h
	end
	local m = l_m[ki]
	local p = j - m
	local push = l_push[ki]
	if p <= l_np[ki] then
		return push[2 * p - 1], push[2 * p]
	end
	return nil
end

-- The algorithms return allowed, remaining, retry_after, reset_after and
-- the new state (at, count, prev, level; for the log: at, count, drop).
-- A check (hits 0) is decided as one hit (probe), as in pkg/algorithms.

local function probe(hits)
	if hits < 1 then
		return 1
	end
	return hits
end

local function fixed_window(req, w, ki, now, hits, over)
	local at, cnt = s_at[ki], s_count[ki]
	local start = now - fmod(now, w)
	if start < at then
		start = at
		if now < at then
			now = at
		end
	end
	local count = 0
	if start == at then
		count = cnt
	end
	local left = sub0(req, count)
	local e = micros(w - (now - start))
	if over or probe(hits) > left then
		local retry, reset = e, e
		if over then
			retry = NEVER
		end
		if count == 0 then
			reset = 0
		end
		return false, left, retry, reset
	end
	count = count + hits
	local reset = 0
	if count > 0 then
		reset = e
	end
	return true, req - count, 0, reset, start, count, 0, 0
end

local function floor_div(num_, den, max)
	local q = floor(num_ / den)
	if not (q < max) then
		return max
	end
	if not (q > 0) then
		return 0
	end
	return q
end

local function sliding_counter(req, w, ki, now, hits, over)
	local at = s_at[ki]
	local start = now - fmod(now, w)
	if start < at then
		start = at
		if now < at then
			now = at
		end
	end
	local cur, prev = 0, 0
	if start == at then
		cur, prev = s_count[ki], s_prev[ki]
	elseif start - w == at then
		prev = s_count[ki]
	end
	local elapsed = now - start
	local fw = w
	local full = req * fw
	local used = prev * (w - elapsed) + cur * fw
	local reset = 0
	if cur > 0 then
		reset = 2 * w - elapsed
	elseif prev > 0 then
		reset = w - elapsed
	end
	local p = probe(hits)
	if over or p > sub0(req, cur) or used + p * fw > full then
		local retry
		if over or p > req then
			retry = NEVER
		elseif p <= sub0(req, cur) then
			local need = (req - cur - p) * fw
			local e = w - floor_div(need, prev, w)
			retry = micros(e - elapsed)
		else
			local need = (req - p) * fw
			local e = w - floor_div(need, cur, w)
			retry = micros(w + e - elapsed)
		end
		return false, floor_u((full - used) / fw), retry, micros(reset)
	end
	cur = cur + hits
	used = used + hits * fw
	if hits > 0 then
		reset = 2 * w - elapsed
	end
	return true, floor_u((full - used) / fw), 0, micros(reset), start, cur, prev, 0
end

local function bucket(req, w, capacity, ki, now, hits, over)
	local at = s_at[ki]
	if now < at then
		now = at
	end
	local fw, rate = w, req
	local full = capacity * fw
	local debt = s_level[ki] - (now - at) * rate
	if debt < 0 then
		debt = 0
	end
	local need = debt + hits * fw
	local p = probe(hits)
	if over or p > capacity or debt + p * fw > full then
		local retry = NEVER
		if not over and p <= capacity then
			retry = ceil_micros((debt + p * fw - full) / rate)
		end
		return false, floor_u((full - debt) / fw), retry, ceil_micros(debt / rate)
	end
	return true, floor_u((full - need) / fw), 0, ceil_micros(need / rate), now, 0, 0, need
end

-- log_live returns the count of key ki's log entries still in the window
-- ending at now, and how many entries at its head have left it.
local function log_live(ki, now, w)
	local count, drop = s_count[ki], l_drop[ki]
	local edge = now - w
	while true do
		local eat, eh = log_at(ki, drop, 1)
		if not eat or eat > edge then
			break
		end
		count = count - eh
		drop = drop + 1
	end
	return count, drop
end

local function sliding_log(req, w, ki, now, hits, over)
	local at = s_at[ki]
	if now < at then
		now = at
	end
	local count, drop = log_live(ki, now, w)
	local left = sub0(req, count)
	local p = probe(hits)
	if over or p > left then
		local retry, reset = 0, 0
		if count > 0 then -- entries are left; the newest is at s_prev
			reset = micros(s_prev[ki] + w - now)
		end
		if over or p > req then
			retry = NEVER
		else
			-- The count must come down to req-p (it may be above req after
			-- usage accounting).
			local need, freed, i = count + p - req, 0, 1
			while true do
				local eat, eh = log_at(ki, drop, i)
				if not eat then
					break
				end
				freed = freed + eh
				if freed >= need then
					retry = micros(eat + w - now)
					break
				end
				i = i + 1
			end
		end
		return false, left, retry, reset
	end
	count = count + hits
	local last = s_prev[ki]
	if hits > 0 then
		last = now
	end
	local reset = 0
	if count > 0 then
		reset = micros(last + w - now)
	end
	return true, req - count, 0, reset, now, count, last, drop
end

local function decide(alg, req, w, capacity, ki, now, hits, over)
	if req == 0 then
		-- Nothing is allowed, not even a check (no room for one hit).
		return false, 0, NEVER, 0
	end
	if alg == FIXED then
		return fixed_window(req, w, ki, now, hits, over)
	elseif alg == BUCKET or alg == GCRA then
		return bucket(req, w, capacity, ki, now, hits, over)
	elseif alg == LOG then
		return sliding_log(req, w, ki, now, hits, over)
	end
	return sliding_counter(req, w, ki, now, hits, over)
end

-- force mirrors the accounting branch of pkg/algorithms (Account): the
-- state after hits that did not fit were charged anyway, as at, count,
-- prev, level (for the log: at, count, last, drop), and for the log
-- whether the charge is recorded as an entry (only while the log has room;
-- a full log saturates). req > 0.
local function force(alg, req, w, ki, now, hits)
	local at = s_at[ki]
	if alg == FIXED or alg == COUNTER then
		local start = now - fmod(now, w)
		if start < at then
			start = at
		end
		local cur, prev = 0, 0
		if start == at then
			cur, prev = s_count[ki], s_prev[ki]
		elseif start - w == at then
			prev = s_count[ki]
		end
		if alg == FIXED then
			prev = 0
		end
		return start, cur + hits, prev, 0, false
	elseif alg == BUCKET or alg == GCRA then
		if now < at then
			now = at
		end
		local debt = s_level[ki] - (now - at) * req
		if debt < 0 then
			debt = 0
		end
		return now, 0, 0, debt + hits * w, false
	end
	if now < at then
		now = at
	end
	local count, drop = log_live(ki, now, w)
	if count < req then -- room in the log: record the whole charge
		return now, count + hits, now, drop, true
	end
	local last = s_prev[ki]
	if count == 0 then
		last = 0
	end
	return now, count, last, drop, false
end

-- reply writes an item's decision at out[o+1..o+4]: allowed + 2*hi, lo,
-- retry_after, reset_after, where remaining = hi*2^32 + lo (hi = 2^32 for
-- a remaining of 2^64 or more, which Go reads as math.MaxUint64). Every
-- value is an integer, so Go reads the reply without parsing strings.
local out

-- store keeps key ki's new state (at nat, count nc, previous np, and the
-- log's drop count or the level nl) for the write at the end of the call,
-- with the entry of hits the sliding log gains when push is set (at nat:
-- now, not before the state's at).
local function store(ki, alg, nat, nc, np, nl, push, hits)
	if alg == LOG then
		s_at[ki], s_count[ki], s_prev[ki], l_drop[ki] = nat, nc, np, nl
		if push then
			local k = l_np[ki] + 1
			l_np[ki] = k
			l_push[ki][2 * k - 1], l_push[ki][2 * k] = nat, hits
		end
	else
		s_at[ki], s_count[ki], s_prev[ki], s_level[ki] = nat, nc, np, nl
	end
end

local function reply(o, ok, rem, retry, reset)
	local a = 0
	if ok then
		a = 1
	end
	if rem >= 4294967296 then
		local hi = floor(rem / 4294967296)
		if hi > 4294967296 then
			hi = 4294967296
		end
		out[o + 1], out[o + 2] = a + 2 * hi, rem - hi * 4294967296
	else
		out[o + 1], out[o + 2] = a, rem
	end
	out[o + 3], out[o + 4] = retry, reset
end

-- Undo log of one request: the keys it changed and their state before.
local u_keys, u_at, u_count, u_prev, u_level, u_drop, u_np, u_reset = {}, {}, {}, {}, {}, {}, {}, {}
local tgen, RQ = {}, 0
local ok_ = {}

local function save(ki, injected)
	local key, reset, alg = K[ki], resets[ki], algs[ki]
	if reset == 0 then
		call("DEL", key)
		return
	end
	local ms = nil
	if reset ~= NEVER then
		ms = ceil(reset / 1000)
		if injected then
			-- A test's clock need not keep pace with Redis's (it may stand
			-- still while real milliseconds pass, and a TTL counts real
			-- time): its keys get the same TTLs, set by the same commands,
			-- an hour longer, so that none expires during a test.
			ms = ms + TEST_TTL_SLACK_MS
		end
	end
	if alg ~= LOG then
		local v
		if alg == COUNTER then
			v = pack(F_STATE3, MAGIC + alg, s_at[ki], s_count[ki], s_prev[ki])
		elseif alg == FIXED then
			v = pack(F_STATE2, MAGIC + alg, s_at[ki], s_count[ki])
		else
			v = pack(F_STATE2, MAGIC + alg, s_at[ki], s_level[ki])
		end
		if ms and alg ~= BUCKET and alg ~= GCRA and w_count[ki] > 0 and s_count[ki] > 0 and w_at[ki] == s_at[ki] then
			-- The key had a count in this same window, so its TTL was set
			-- to the same instant: the window's end for a fixed window,
			-- the next window's for a counter (its count in this window
			-- is not zero). SET ... PX costs Redis 2.5 times SET ... KEEPTTL
			-- (it is rewritten to PXAT for replication). Redis before 6.0
			-- has no KEEPTTL: then SET ... PX.
			if pcall_("SET", key, v, "KEEPTTL").err then
				call("SET", key, v, "PX", ms)
			end
		elseif ms then
			call("SET", key, v, "PX", ms)
		else
			call("SET", key, v)
		end
		return
	end
	local header = pack(F_STATE3, MAGIC + LOG, s_at[ki], s_count[ki], s_prev[ki])
	local drop, m = l_drop[ki], l_m[ki]
	local trim = drop
	if m and trim > m then -- without m, fewer than m were read
		trim = m
	end
	local new, nn = {}, 0
	local push = l_push[ki]
	for k = drop - trim + 1, l_np[ki] do
		local at, h = push[2 * k - 1], push[2 * k]
		nn = nn + 1
		if h == 1 then
			new[nn] = pack(F_ENTRY1, at)
		else
			new[nn] = pack(F_ENTRY2, at, h)
		end
	end
	if l_exists[ki] then
		if trim > 0 then
			call("LTRIM", key, trim, -1)
		end
		call("LSET", key, 0, header)
		if nn > 0 then
			call("RPUSH", key, unpk(new))
		end
	else
		call("RPUSH", key, header, unpk(new))
	end
	if ms then
		call("PEXPIRE", key, ms)
	else
		call("PERSIST", key)
	end
end

-- apply runs one call: keys are KEYS, args ARGV (see script.go).
local function apply(keys, args)
	if not floor then
		bind()
	end
	K = keys
	G = G + 1
	dn = 0
	out = {}
	local A, no = args[1], 0
	local time_now, injected
	if #args ~= 1 then
		fail("envoy-rls: ARGV is one string")
	end
	local p, na = 1, #A
	while p <= na do
		local now, n
		now, n, p = unpack_(F_REQUEST, A, p)
		if now < 0 then
			if not time_now then
				local t = call("TIME")
				time_now = tonum(t[1]) * 1000000 + tonum(t[2])
			end
			now = time_now
		else
			injected = true
		end
		local whole = n > 0
		if not whole then
			n = -n
		end
		if p + n * ITEM_BYTES > na + 1 then
			fail("envoy-rls: malformed arguments")
		end
		local first = p
		no = no + 1
		local commit_at = no
		out[no] = 1
		RQ = RQ + 1
		local u_n, dn0 = 0, dn
		local enforced_ok, groups = true, nil
		for i = 1, n do
			local ki, alg, mode, bits, group, req, w, capacity, hits
			ki, alg, mode, bits, group, req, w, capacity, hits, p = unpack_(F_ITEM, A, p)
			local over, acct = bits % 2 == 1, bits >= BIT_ACCOUNT
			if alg > GCRA or mode > QUOTA or bits > 3 or not K[ki] then
				fail("envoy-rls: unknown algorithm, mode or key in item " .. i)
			end
			if lgen[ki] ~= G then
				load(ki, alg)
			elseif algs[ki] ~= alg then
				fail("envoy-rls: items of key " .. K[ki] .. " use different algorithms")
			end
			local ok, rem, retry, reset, nat, nc, np, nl = decide(alg, req, w, capacity, ki, now, hits, over)
			local charge, push = ok, hits > 0 and req > 0
			if not ok and acct and req > 0 then
				-- Usage accounting: charged although it does not fit.
				nat, nc, np, nl, push = force(alg, req, w, ki, now, hits)
				charge = true
			end
			if charge then
				-- A request of one item that allows commits exactly when
				-- it is allowed: it needs no undo. (One that is accounted
				-- without fitting may not commit, and is charged again
				-- from the state before it.)
				if (n > 1 or not ok) and tgen[ki] ~= RQ then
					tgen[ki] = RQ
					u_n = u_n + 1
					u_keys[u_n] = ki
					u_at[u_n], u_count[u_n], u_prev[u_n], u_level[u_n] = s_at[ki], s_count[ki], s_prev[ki], s_level[ki]
					u_drop[u_n], u_np[u_n], u_reset[u_n] = l_drop[ki], l_np[ki], resets[ki]
				end
				store(ki, alg, nat, nc, np, nl, push, hits)
				if not ok then
					-- Accounted: the decision is a check of the state after
					-- the charge, denied.
					local _
					_, rem, retry, reset = decide(alg, req, w, capacity, ki, now, 0, false)
				end
				resets[ki] = reset
				if dgen[ki] ~= G then
					dgen[ki] = G
					dn = dn + 1
					dl[dn] = ki
				end
			end
			ok_[i] = ok
			if mode == ENFORCED then
				if not ok then
					enforced_ok = false
				end
			elseif mode == QUOTA then
				groups = groups or {}
				groups[group] = groups[group] or not ok
			end
			reply(no, ok, rem, retry, reset)
			no = no + 4
		end
		local commit = enforced_ok
		if commit and whole and groups then
			commit = false
			for _, denied in each(groups) do
				if not denied then
					commit = true
					break
				end
			end
		end
		if not commit then
			out[commit_at] = 0
			-- Undo, newest first, then report the allowing items' state
			-- as it stays.
			for j = u_n, 1, -1 do
				local ki = u_keys[j]
				s_at[ki], s_count[ki], s_prev[ki], s_level[ki] = u_at[j], u_count[j], u_prev[j], u_level[j]
				l_drop[ki], resets[ki] = u_drop[j], u_reset[j]
				if algs[ki] == LOG then
					local push, k = l_push[ki], u_np[j]
					for x = 2 * l_np[ki], 2 * k + 1, -1 do
						push[x] = nil
					end
					l_np[ki] = k
				end
			end
			for j = dn0 + 1, dn do
				dgen[dl[j]] = 0
			end
			dn = dn0
			-- Only usage accounting is charged: charge it again (its replies
			-- stay the ones the verdict was made of), and report the other
			-- allowing items' state as it stays.
			local q = first
			for i = 1, n do
				local ki, alg, _, bits, _, req, w, capacity, hits
				ki, alg, _, bits, _, req, w, capacity, hits, q = unpack_(F_ITEM, A, q)
				if bits >= BIT_ACCOUNT and req > 0 then
					local over = bits % 2 == 1
					local ok, _, _, reset, nat, nc, np, nl = decide(alg, req, w, capacity, ki, now, hits, over)
					local push = hits > 0
					if not ok then
						nat, nc, np, nl, push = force(alg, req, w, ki, now, hits)
					end
					store(ki, alg, nat, nc, np, nl, push, hits)
					if not ok then
						local _
						_, _, _, reset = decide(alg, req, w, capacity, ki, now, 0, false)
					end
					resets[ki] = reset
					if dgen[ki] ~= G then
						dgen[ki] = G
						dn = dn + 1
						dl[dn] = ki
					end
				elseif ok_[i] then
					local _, rem, _, reset = decide(alg, req, w, capacity, ki, now, 0, false)
					reply(commit_at + 4 * (i - 1), true, rem, 0, reset)
				end
			end
		end
	end
	-- Save every charged key once.
	for j = 1, dn do
		save(dl[j], injected)
	end
	return out
end
