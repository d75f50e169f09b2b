-- Lease and reconcile primitive of the hybrid limiter, on the window
-- counters that global's FixedWindow and SlidingWindow scripts use too. One
-- atomic call per key: give back unused quota, report units admitted on
-- credit, lease a slice of the current window and, near its end, a slice of
-- the next one.
--
-- KEYS[1]  key base "<prefix>:{<tag>}:"
-- ARGV[1]  counter kind: "fw..." (FixedWindow) or "sw..." (SlidingWindow);
--          window i's counter is KEYS[1] .. kind .. ':' .. i
-- ARGV[2]  P, the period in microseconds      ARGV[3]  R, the rate
-- ARGV[4]  now in microseconds, or -1 to read TIME
-- ARGV[5]  the call's nonce, a few random characters without digits or
--          ':' ("" keeps no record)
-- ARGV[6]  1 when the call is sent again after its reply was lost
-- ARGV[7]  instances sharing the quota (caps a grant at remainder / instances)
-- ARGV[8]  want: units wanted from the current window (0: none)
-- ARGV[9]  min: the least grant from the current window worth having
-- ARGV[10] want_next: units wanted from the next window (0: none)
-- ARGV[11] lead: a grant from the next window is made only when the
--          current one ends within lead microseconds
-- ARGV[12..] adjustments, three values each: window index, units to give
--          back (refund), units admitted on credit to add (use)
--
-- Returns {idx, now, reset, grant, count, retry, grant_next, count_next,
-- flag}: the current window (by this call's clock, or, for a replay, the
-- window the call was first applied in) and the time used; microseconds to
-- its end; the units granted from it and its count afterwards (for sw, the
-- count that bounds further grants: the weighted estimate now or, if
-- larger, what the next window will start from); when grant < min, the
-- microseconds until min units could fit; the same pair for the next window.
-- flag 0: applied now (also a resent call that had been sent as a plain
-- increment, whose record nonce .. '!' this call finds: its units are
-- given back first). 1: a resent call that was applied before: its
-- original grants are returned and nothing is applied again. 2: a resent
-- call whose first attempt cannot be told applied or not (another call
-- wrote the record since): only its credit is applied (counting it twice is
-- the safe side), never its refunds or grants.
--
-- Replay protection keeps one record per window counter, not one per
-- caller: field r of a window's hash holds the last call applied that wrote
-- it: its nonce and grants, in base 36, as nonce .. grant (.. ':' ..
-- grant_next when not 0), stored in the call's current window; or, for a
-- call that only leased from the next window, nonce .. ':' .. grant_next
-- in the next window's counter. Its size does not grow with the fleet,
-- and it stays within 11 characters for grants below 36^3, which keeps a
-- key's hash in the smallest allocation a small hash gets.
local base, kind = KEYS[1], ARGV[1]
local P, R = tonumber(ARGV[2]), tonumber(ARGV[3])
local now = clock(ARGV[4])
local nonce, resent = ARGV[5], ARGV[6] == '1'
local n = tonumber(ARGV[7])
if n < 1 then n = 1 end
local want, minimum = tonumber(ARGV[8]), tonumber(ARGV[9])
local want_next, lead = tonumber(ARGV[10]), tonumber(ARGV[11])
if minimum < 1 then minimum = 1 end

local idx = fdiv(now, P)
local e = now - idx * P
local reset = P - e
local sw = string.sub(kind, 1, 2) == 'sw'
local span = P -- how long a counter matters after its window starts
if sw then span = 2 * P end

-- The counters this call touches, by window index less idx (small keys:
-- some Lua tables size an array part to a large integer key), read once:
-- window (i), key (k),
-- count (c), Redis type (t: 'string' for a counter a global limiter wrote,
-- else 'hash'), whether the call changed them (dirty) and must set their
-- expiry.
local ctr = {}
local function get(i)
  local x = ctr[i - idx]
  if x then return x end
  local k = wkey(base, kind, i)
  local t, c = 'hash', 0 -- 'hash' also for a counter not there yet
  local v = redis.pcall('HGET', k, 'c')
  if type(v) == 'table' then -- WRONGTYPE: a string a global limiter wrote
    t, c = 'string', tonumber(redis.call('GET', k))
  elseif v then
    c = tonumber(v)
  end
  x = {i = i, k = k, t = t, c = c}
  ctr[i - idx] = x
  return x
end
local function count(i) return get(i).c end
-- set changes window i's count; record puts the call's record on it. The
-- counters are written once, at the end.
local function set(i, c)
  local x = get(i)
  x.c, x.dirty = c, true
end
local function expire(i) get(i).expire = true end

-- used(i): what bounds grants from window i (idx or idx + 1) as a count;
-- grants are made while it stays at most R. For sw, the next window starts
-- from the current one weighted fully, so a grant from either must leave
-- curr + next <= R, and one from the current must also keep the weighted
-- estimate <= R.
local function used(i)
  if not sw then return count(i) end
  local u = count(idx) + count(idx + 1)
  if i == idx then
    local est = fdiv(count(idx - 1) * (P - e), P) + count(idx)
    if est > u then u = est end
  end
  return u
end

local digits = '0123456789abcdefghijklmnopqrstuvwxyz'
local function b36(v)
  if v == 0 then return '0' end
  local out = ''
  while v > 0 do
    local d = v % 36
    out = string.sub(digits, d + 1, d + 1) .. out
    v = (v - d) / 36
  end
  return out
end

local function size(w, lo, room)
  if w <= 0 or room < lo then return 0 end
  -- At most this caller's share of the remainder, but never a cascade of
  -- tiny grants: the last quarter of the limit goes out in chunks of
  -- R / (4 x instances) to whoever asks first.
  local cap = fdiv(room, n)
  local tail = cdiv(R, 4 * n)
  if cap < tail then cap = tail end
  if cap < lo then cap = lo end
  if w > cap then w = cap end
  if w > room then w = room end
  if w < lo then w = lo end
  return w
end

local plain_ran = nil
if resent and nonce ~= '' then
  for i = idx + 1, idx - 2, -1 do
    local x = get(i)
    local r = nil
    if x.t == 'hash' then r = redis.call('HGET', x.k, 'r') end
    if r == nonce .. '!' then
      -- The call was sent as a plain increment of window i's counter by
      -- want + want_next (the hybrid's plain lease), which wrote this
      -- record after it: it ran. Its units are given back, and the call
      -- is made now as a new one.
      plain_ran = x
      break
    end
    local g, colon, gn
    if r and string.sub(r, 1, #nonce) == nonce then
      g, colon, gn = string.match(string.sub(r, #nonce + 1), '^(%w*)(:?)(%w*)$')
    end
    if g then
      -- The call was applied when window w was the current one: the record
      -- sits in w's counter, or in w + 1's without the grant. A grant from
      -- a window that has ended is worth nothing.
      local w = i
      if g == '' then w, g = i - 1, '0' end
      if gn == '' then gn = '0' end
      if w >= idx - 1 and w <= idx then
        local c, cn = R, used(idx)
        if w == idx then c, cn = used(idx), used(idx + 1) end
        return {w, now, P - (now - w * P), tonumber(g, 36), c, 0, tonumber(gn, 36), cn, 1}
      end
    end
  end
end

local lo = idx
if sw then lo = idx - 1 end
local adjusted = false
if plain_ran then
  resent = false
  if plain_ran.i >= lo then
    local c = plain_ran.c - want - want_next
    if c < 0 then c = 0 end
    set(plain_ran.i, c)
    adjusted = true
  end
end
for j = 12, #ARGV - 2, 3 do
  local w, refund, use = tonumber(ARGV[j]), tonumber(ARGV[j + 1]), tonumber(ARGV[j + 2])
  -- Windows that no longer bound anything are left alone.
  if w >= lo and w <= idx + 1 then
    local c = count(w)
    local d = use
    if not resent then d = d - refund end
    if d > 0 or (d < 0 and c > 0) then
      c = c + d
      if c < 0 then c = 0 end -- a refund never drives a counter below zero
      set(w, c)
      adjusted = true
      if use > 0 then expire(w) end -- credit may create the counter
      -- (a refund keeps the expiry: HSET does)
    end
  end
end

local grant, grant_next, retry = 0, 0, 0
local rec = nil
if not resent then
  if want > 0 then
    grant = size(want, minimum, R - used(idx))
    if grant > 0 then
      set(idx, count(idx) + grant)
      expire(idx)
    else
      -- the earliest time min units could fit, as global computes RetryAfter
      if not sw then
        retry = reset
      else
        local curr, nxt = count(idx), count(idx + 1)
        if curr + nxt + minimum <= R then
          retry = first(count(idx - 1), R - curr - minimum, P) - e
        else
          retry = reset + first(curr, R - nxt - minimum, P)
        end
      end
      if retry < 1 then retry = 1 end
    end
  end
  if want_next > 0 and reset <= lead then
    local room = R - used(idx + 1)
    if sw and e > 0 then
      -- a sliding window's next window starts from this one weighted
      -- whole: leave this one what it is on course to count still (its
      -- count so far, at its pace so far, to its end)
      room = room - cdiv(count(idx) * (P - e), e)
    end
    grant_next = size(want_next, 1, room)
    if grant_next > 0 then
      set(idx + 1, count(idx + 1) + grant_next)
      expire(idx + 1)
    end
  end
  if nonce ~= '' and (adjusted or grant > 0 or grant_next > 0) then
    -- A call that changed nothing writes no record: resent, it is unknown,
    -- with nothing to apply twice, and the record of a call that did change
    -- something stays for its own resend. The record goes in a counter the
    -- call writes anyway when it can: the next window's, for a call that
    -- only leases from it.
    local w, rec = idx, nonce .. b36(grant)
    if grant_next > 0 then rec = rec .. ':' .. b36(grant_next) end
    if want == 0 and grant_next > 0 and not (ctr[0] and ctr[0].dirty) then
      w, rec = idx + 1, nonce .. ':' .. b36(grant_next)
    end
    local x = get(w)
    x.r, x.dirty = rec, true
    expire(w)
  end
end
-- Write what changed: as hashes, converting a counter a global limiter
-- wrote as a string (its expiry kept unless the call sets one).
for _, x in pairs(ctr) do
  if x.dirty then
    local keep = 0
    if x.t == 'string' then
      keep = redis.call('PTTL', x.k)
      redis.call('DEL', x.k)
    end
    if x.r then
      redis.call('HSET', x.k, 'c', x.c, 'r', x.r)
    else
      redis.call('HSET', x.k, 'c', x.c)
    end
    if x.expire then
      redis.call('PEXPIRE', x.k, expiry_ms(x.i * P + span - now))
    elseif keep > 0 then
      redis.call('PEXPIRE', x.k, keep)
    end
  end
end
local count_next = -1 -- not asked
if want_next > 0 or sw or ctr[1] then count_next = used(idx + 1) end
return {idx, now, reset, grant, used(idx), retry, grant_next, count_next, resent and 2 or 0}
