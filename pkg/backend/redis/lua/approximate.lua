-- approximate.lua: the sync of consistency approximate (see approximate.go),
-- many keys per call (on a Cluster, keys of one slot), in the state formats
-- of state.lua (fixed_window and sliding_window_counter only).
--
-- Per key k, KEYS[2k-1] is the state and KEYS[2k] the hash of the instances
-- syncing it (same slot: the key's hash tag). A field per instance:
-- "seq,window,share,seen": the last batch of hits it sent (so a batch sent
-- twice counts once), the window of its share, the share (hits it may still
-- admit before its next sync) and when it synced (µs).
--
-- ARGV: now (µs, or -1 for Redis's TIME), the instance, hold (µs a field
-- counts as live after its sync), bye (1: the instance leaves, its field
-- goes), the number of keys; then per key: algorithm, requests, window (µs),
-- r (the hits its share may still admit, and those it admitted but did not
-- send yet), rw (the window of that share), want (the share its demand
-- asks for, at least 1), nb, and nb batches of hits admitted (seq, window,
-- hits).
--
-- A batch whose seq is above the field's is added to its window's count (a
-- sliding counter's previous window too; older windows are gone). Then the
-- share: free = remaining - the live shares of the other instances in this
-- window - r (for a sliding counter, the others' shares of the previous
-- window weigh as hits of that window not sent yet); share = min(free,
-- want, ceil(free / active instances)). So the hits admitted, counted or still
-- held as shares, never exceed the limit unless strict decisions that do
-- not see the shares take from it.
--
-- Reply per key: {window start, share, free - share, µs until the window
-- ends, active instances, seq acknowledged, remaining, hits over the limit
-- not reported before}.

local FIXED, COUNTER = 0, 3
local MAGIC = 240
local TEST_TTL_SLACK_MS = 3600000

local now, id, hold, bye, nk =
	tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local slack = 0
if now < 0 then
	local t = redis.call("TIME")
	now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
	slack = TEST_TTL_SLACK_MS
end
local floor, ceil, fmod = math.floor, math.ceil, math.fmod

local function set(key, val, ttl_us)
	local ms = ceil(ttl_us / 1000)
	if ms < 1 then
		ms = 1
	end
	redis.call("SET", key, val, "PX", ms + slack)
end

local out = {}
local a = 6
for k = 1, nk do
	local key, hkey = KEYS[2 * k - 1], KEYS[2 * k]
	local alg, req, w, r, rw, want, nb =
		tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]),
		tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5]), tonumber(ARGV[a + 6])
	a = a + 7

	local at, cnt, prev = 0, 0, 0
	local v = redis.call("GET", key)
	if v and string.byte(v, 1) == MAGIC + alg then
		local _
		if alg == COUNTER and #v == 25 then
			_, at, cnt, prev = struct.unpack("<Bddd", v)
		elseif alg == FIXED and #v == 17 then
			_, at, cnt = struct.unpack("<Bdd", v)
		end
	end
	local start = now - fmod(now, w)
	if start < at then
		start = at
	end
	local cur, pv = 0, 0
	if start == at then
		cur, pv = cnt, prev
	elseif alg == COUNTER and start - w == at then
		pv = cnt
	end
	if alg == FIXED then
		pv = 0
	end

	-- The instances' fields: this one's last batch counted; the live
	-- others weigh, long-gone ones go.
	local keep = 2 * w
	if keep < 60000000 then
		keep = 60000000
	end
	local seq, reported = 0, 0
	local others, otherPrev, active = 0, 0, 1
	local parts = redis.call("HGETALL", hkey)
	for j = 1, #parts, 2 do
		local f = parts[j]
		if f == id then
			seq = tonumber(string.match(parts[j + 1], "^([^,]+),"))
		elseif f == "over" then
			local ow, ov = string.match(parts[j + 1], "^([^,]+),(.+)$")
			if tonumber(ow) == start then
				reported = tonumber(ov)
			end
		else
			local _, fw, fv, seen = string.match(parts[j + 1], "^([^,]+),([^,]+),([^,]+),(.+)$")
			fw, fv, seen = tonumber(fw), tonumber(fv), tonumber(seen)
			if seen + hold > now then
				active = active + 1
				if fw == start then
					others = others + fv
				elseif alg == COUNTER and fw == start - w then
					otherPrev = otherPrev + fv
				end
			elseif seen + keep < now then
				redis.call("HDEL", hkey, f)
			end
		end
	end
	local top, added = seq, 0
	for _ = 1, nb do
		local bs, bw, bn = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
		a = a + 3
		if bs > seq then
			if bs > top then
				top = bs
			end
			if bw == start then
				cur, added = cur + bn, added + bn
			elseif alg == COUNTER and bw == start - w then
				pv, added = pv + bn, added + bn
			end
		end
	end

	local elapsed = now - start
	local left, over
	if alg == FIXED then
		left = req - cur
		over = cur - req
	else
		local used = pv * (w - elapsed) + cur * w
		over = floor((used - req * w) / w)
		left = floor((req * w - used - otherPrev * (w - elapsed)) / w)
		if left > req - cur then
			left = req - cur
		end
	end
	if left < 0 then
		left = 0
	end
	-- Hits over the limit are reported once, by the first sync that sees
	-- them (the field "over" keeps the most reported in this window).
	if over > reported then
		redis.call("HSET", hkey, "over", string.format("%.17g,%.17g", start, over))
		over = over - reported
	else
		over = 0
	end
	local mine = 0
	if rw == start then
		mine = r
	end
	local free = left - others - mine
	local share = 0
	if free > 0 and bye == 0 then
		share = ceil(free / active)
		if share > want then
			share = want
		end
		if share > free then
			share = free
		end
	else
		free = 0
	end

	if added > 0 then
		if alg == FIXED then
			set(key, struct.pack("<Bdd", MAGIC + alg, start, cur), start + w - now)
		else
			set(key, struct.pack("<Bddd", MAGIC + alg, start, cur, pv), 2 * w - elapsed)
		end
	end
	if bye == 1 then
		redis.call("HDEL", hkey, id)
	else
		redis.call("HSET", hkey, id, string.format("%.17g,%.17g,%.17g,%.17g", top, start, mine + share, now))
		redis.call("PEXPIRE", hkey, ceil(keep / 1000) + slack)
	end
	out[k] = {start, share, free - share, start + w - now, active, top, left, over}
end
return out
