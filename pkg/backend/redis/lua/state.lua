-- The Redis side of the Redis store: the Lua twin of pkg/algorithms and
-- of the memory store, with the same formulas in the same order, so both
-- stores give identical decisions. One call decides a batch of requests
-- (on a Cluster, the parts of requests in one hash slot), in order, each
-- one all-or-nothing on its own and seeing the state the ones before it
-- left; each key is read once and written once per call. Lua numbers are
-- doubles: every count, limit and instant is exact below 2^53. Arguments
-- and states are binary (the struct library): a double reads back
-- exactly, so nothing is parsed or formatted as text.
--
-- The script is three files, which script.go joins in this order into
-- one: state.lua (this file: constants, the per-call tables, reading a
-- key's state), algorithms.lua (the five algorithms) and apply.lua (the
-- transaction, the writes and the reply, and the entry point apply(keys,
-- args)). The layout of KEYS, ARGV, the reply and the stored state is
-- documented in script.go, next to the Go code that writes and reads it.
-- script.go wraps the joined script two ways: as a function library
-- (FUNCTION LOAD, called with FCALL, where the tables below outlive a
-- call and are reused), and as a script for EVALSHA/EVAL on servers
-- without functions.

-- Copies of Go's constants (algorithms.Kind, backend.Mode, algorithms.Never,
-- the layout of script.go); TestScriptConstantsMatchGo fails when they
-- differ.
local FIXED, BUCKET, LOG, COUNTER, GCRA = 0, 1, 2, 3, 4
local ENFORCED, SHADOW, QUOTA = 0, 1, 2
local REQUEST_BYTES, ITEM_BYTES = 12, 43
local BIT_OVER, BIT_ACCOUNT, BIT_REFUND = 1, 2, 4
local MAGIC = 240 -- the first byte of a state: MAGIC + the algorithm
local TEST_TTL_SLACK_MS = 3600000 -- added to TTLs under a test's clock (see save)
local NEVER = -1
local NEVER_US = 9223372036854775 -- algorithms.Never in µs
local MAX_TTL_MS = 9223372036854 -- algorithms.Never in ms: the longest TTL (see save)
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
local F_STATE2, F_STATE3, F_STATE4, F_ENTRY1, F_ENTRY2 = "<Bdd", "<Bddd", "<Bdddd", "<d", "<dd"
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
	elseif n == 33 and (alg == BUCKET or alg == GCRA) then
		-- A bucket with tokens held by lease chunks (lease.lua): held in
		-- s_prev, until the instant in s_count.
		_, s_at[ki], s_level[ki], s_prev[ki], s_count[ki] = unpack_(F_STATE4, v)
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

