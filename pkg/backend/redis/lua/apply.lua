-- apply.lua: one call's transaction (every request all-or-nothing, each key
-- read once and written once) and its reply; the entry point apply(keys,
-- args). It comes last of state.lua, algorithms.lua and this file, which
-- script.go joins into one script.

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
-- The state's at each charge of a request wrote (-1: none): the reply of
-- a part of a request ends with them, for a refund (see refund).
local at_ = {}

-- ttl_ms returns the TTL of a key whose state is fresh after reset µs
-- (not 0). Every key written gets a finite positive TTL: its ResetAfter
-- rounded up to the millisecond, saturated at algorithms.Never (about 292
-- years: a state fresh only later still, a limit whose full refill takes
-- that long, gets that much, as the memory store keeps such an entry until
-- then).
local function ttl_ms(reset, injected)
	local ms = MAX_TTL_MS
	if reset ~= NEVER and reset > 0 then
		ms = ceil(reset / 1000)
		if not (ms < MAX_TTL_MS) then
			ms = MAX_TTL_MS
		end
	end
	if injected then
		-- A test's clock need not keep pace with Redis's (it may stand
		-- still while real milliseconds pass, and a TTL counts real time):
		-- its keys get the same TTLs, set by the same commands, an hour
		-- longer, so that none expires during a test.
		ms = ms + TEST_TTL_SLACK_MS
	end
	return ms
end

local function save(ki, injected)
	local key, reset, alg = K[ki], resets[ki], algs[ki]
	if reset == 0 then
		call("DEL", key)
		return
	end
	local ms = ttl_ms(reset, injected)
	if alg ~= LOG then
		local v
		if alg == COUNTER then
			v = pack(F_STATE3, MAGIC + alg, s_at[ki], s_count[ki], s_prev[ki])
		elseif alg == FIXED then
			v = pack(F_STATE2, MAGIC + alg, s_at[ki], s_count[ki])
		else
			if s_prev[ki] > 0 then
				v = pack(F_STATE4, MAGIC + alg, s_at[ki], s_level[ki], s_prev[ki], s_count[ki])
			else
				v = pack(F_STATE2, MAGIC + alg, s_at[ki], s_level[ki])
			end
		end
		if alg ~= BUCKET and alg ~= GCRA and w_count[ki] > 0 and s_count[ki] > 0 and w_at[ki] == s_at[ki] then
			-- The key had a count in this same window, so its TTL was set
			-- to the same instant: the window's end for a fixed window,
			-- the next window's for a counter (its count in this window
			-- is not zero). SET ... PX costs Redis 2.5 times SET ... KEEPTTL
			-- (it is rewritten to PXAT for replication). Redis before 6.0
			-- has no KEEPTTL: then SET ... PX.
			if pcall_("SET", key, v, "KEEPTTL").err then
				call("SET", key, v, "PX", ms)
			end
		else
			call("SET", key, v, "PX", ms)
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
	call("PEXPIRE", key, ms)
end

-- refund takes back the hits of one admission charge that a part of a
-- request split across Cluster slots made in an earlier call (at ca: the
-- state's at that charge wrote, see apply), the request being denied in
-- another slot, and replies at out[o+1..o+4] the key's state as it stays,
-- as a check. Requests of other callers may have charged the key since:
-- the refund takes back only what is still there of this charge, so the
-- state is the one without it:
--   - fixed_window and sliding_window_counter: the count of window ca, if
--     it is still the current window (or the previous one of a counter);
--   - sliding_window_log: the charge's entry, if it is still stored;
--   - token_bucket and gcra: the debt the charge added, at most the debt
--     left; when another request wrote the key after the charge, less what
--     the limit refilled from the charge to that write (the debt may have
--     drained below the charge meanwhile, taking part of it away already:
--     the state does not tell, so the refund never takes back more than
--     what may be left of it).
-- The key is read afresh and written at once: a refund call holds refunds
-- only, and may take back several charges of one key.
local function refund(ki, alg, req, w, capacity, hits, ca, now, injected, o)
	G = G + 1
	dn = 0
	load(ki, alg)
	local key, changed = K[ki], false
	if hits == 0 then
		-- A check: only the reply.
		local _ = nil
	elseif alg == FIXED then
		if s_at[ki] == ca and s_count[ki] > 0 then
			s_count[ki], changed = sub0(s_count[ki], hits), true
		end
	elseif alg == COUNTER then
		if s_at[ki] == ca and s_count[ki] > 0 then
			s_count[ki], changed = sub0(s_count[ki], hits), true
		elseif s_at[ki] == ca + w and s_prev[ki] > 0 then
			s_prev[ki], changed = sub0(s_prev[ki], hits), true
		end
	elseif alg == BUCKET or alg == GCRA then
		local last = s_at[ki]
		local at, level, held, until_ = bucket_base(ki, now, w, req)
		local t = now
		if t < at then
			t = at
		end
		local debt = level - (t - at) * req
		if debt < 0 then
			debt = 0
		end
		local e = hits * w
		if last > ca then
			e = e - (last - ca) * req
		end
		if e > debt then
			e = debt
		end
		if e > 0 then
			store(ki, alg, at, until_, held, level - e)
			changed = true
		end
	else
		local v
		if hits == 1 then
			v = pack(F_ENTRY1, ca)
		else
			v = pack(F_ENTRY2, ca, hits)
		end
		if l_exists[ki] and call("LREM", key, -1, v) > 0 then
			local last = s_prev[ki]
			if last == ca then
				-- The newest entry may be gone: the newest left is.
				last = 0
				local t = call("LINDEX", key, -1)
				if t then
					last = parse_entry(t) or 0
				end
			end
			call("LSET", key, 0, pack(F_STATE3, MAGIC + LOG, s_at[ki], sub0(s_count[ki], hits), last))
			G = G + 1
			load(ki, alg)
			local _, rem, _, reset = decide(alg, req, w, capacity, ki, now, 0, false)
			if reset == 0 then
				call("DEL", key)
			else
				call("PEXPIRE", key, ttl_ms(reset, injected))
			end
			reply(o, true, rem, 0, reset)
			return
		end
	end
	local _, rem, _, reset = decide(alg, req, w, capacity, ki, now, 0, false)
	if changed then
		resets[ki] = reset
		save(ki, injected)
	end
	reply(o, true, rem, 0, reset)
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
	local time_now, injected, refunds
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
		if n > 0 and byte(A, p + 6) >= BIT_REFUND then
			-- A refund (see refund): every item is one, with the instant
			-- of its charge after it, and the call holds refunds only.
			if no > 0 and not refunds then
				fail("envoy-rls: refunds in a call of their own")
			end
			refunds = true
			no = no + 1
			out[no] = 1
			for _ = 1, n do
				local ki, alg, _, bits, _, req, w, capacity, hits, ca
				ki, alg, _, bits, _, req, w, capacity, hits, p = unpack_(F_ITEM, A, p)
				if p + 8 > na + 1 or bits ~= BIT_REFUND or alg > GCRA or not K[ki] then
					fail("envoy-rls: malformed refund")
				end
				ca, p = unpack_("<d", A, p)
				if req > 0 then
					refund(ki, alg, req, w, capacity, hits, ca, now, injected, no)
				else
					out[no + 1], out[no + 2], out[no + 3], out[no + 4] = 1, 0, 0, 0
				end
				no = no + 4
			end
		else
			if refunds then
				fail("envoy-rls: refunds in a call of their own")
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
				at_[i] = -1
				if not ok and acct and req > 0 then
					-- Usage accounting: charged although it does not fit.
					nat, nc, np, nl, push = force(alg, req, w, capacity, ki, now, hits)
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
					at_[i] = nat
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
							nat, nc, np, nl, push = force(alg, req, w, capacity, ki, now, hits)
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
			if not whole then
				for i = 1, n do
					no = no + 1
					if commit then
						out[no] = at_[i]
					else
						out[no] = -1
					end
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
