-- algorithms.lua: the five algorithms, the Lua twins of pkg/algorithms.
-- script.go joins state.lua, this file and apply.lua, in that order, into
-- one script: what a file uses is defined in the files before it.

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

-- bucket_base returns key ki's bucket state (at, level, held, until) as
-- of now: held tokens (taken by lease chunks, lease.lua) do not refill
-- until the instant until; once it has passed, they count as taken then.
-- Without chunks held is 0 and the state is the Go twin's.
local function bucket_base(ki, now, w, rate)
	local at, level, held, until_ = s_at[ki], s_level[ki], s_prev[ki], s_count[ki]
	if held <= 0 then
		return at, level, 0, 0
	end
	if now < until_ then
		return at, level, held, until_
	end
	if until_ > at then
		level = level - (until_ - at) * rate
		if level < 0 then
			level = 0
		end
		at = until_
	end
	return at, level + held * w, 0, 0
end

local function bucket(req, w, capacity, ki, now, hits, over)
	local fw, rate = w, req
	local at, level, held, until_ = bucket_base(ki, now, w, rate)
	if now < at then
		now = at
	end
	local full = capacity * fw
	local debt = level - (now - at) * rate
	if debt < 0 then
		debt = 0
	end
	local hw, wait = held * fw, 0
	if held > 0 then
		wait = until_ - now -- the held tokens start refilling then
	end
	local need = debt + hits * fw
	local p = probe(hits)
	if over or p > capacity or debt + hw + p * fw > full then
		local retry = NEVER
		if not over and p <= capacity then
			retry = ceil_micros((debt + hw + p * fw - full) / rate)
		end
		return false, floor_u((full - debt - hw) / fw), retry, ceil_micros(wait + (debt + hw) / rate)
	end
	return true, floor_u((full - need - hw) / fw), 0, ceil_micros(wait + (need + hw) / rate), now, until_, held, need
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
-- a full log saturates). A bucket's debt is capped at one window's worth
-- of the limit below empty (algorithms.MaxDebt). req > 0.
local function force(alg, req, w, capacity, ki, now, hits)
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
		local level, held, until_
		at, level, held, until_ = bucket_base(ki, now, w, req)
		if now < at then
			now = at
		end
		local debt = level - (now - at) * req
		if debt < 0 then
			debt = 0
		end
		local need, most = debt + hits * w, capacity * w + req * w
		if need > most then
			need = most
		end
		return now, until_, held, need, false
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

