-- Lease and reconcile primitive of the hybrid limiter, for the window
-- counters fw:<idx> / sw:<idx> that global's FixedWindow and SlidingWindow
-- scripts use too. One atomic call per key: give back unused quota, report
-- usage admitted on credit, and lease a new slice of the current window.
--
-- KEYS[1]  key base "<prefix>:{<tag>}:"
-- ARGV[1]  "fw" or "sw"
-- ARGV[2]  P, the period in microseconds
-- ARGV[3]  R, the rate
-- ARGV[4]  now in microseconds, or -1 to read TIME
-- ARGV[5]  refund window index (-1: none)   ARGV[6]  units to refund
-- ARGV[7]  use window index (-1: none)      ARGV[8]  units used on credit
-- ARGV[9]  want: units wanted from the current window (0: none)
-- ARGV[10] min: the least grant worth having; below it nothing is granted
-- ARGV[11] instances sharing the quota (the grant is capped at the
--          remainder / instances, never below min)
-- ARGV[12] instance id ("" disables idempotency)
-- ARGV[13] sequence number of this call for the instance and key
--
-- Returns {grant, idx, est, now, retry, reset, replay}: the units granted
-- from window idx; the window's count after the call (for sw, the weighted
-- estimate); the time used; when grant < min, the microseconds until min
-- could fit; the microseconds to the end of window idx; 0 for a call applied
-- now, 1 when this call was applied before and its reply is replayed, 2 when
-- a later call of the instance was applied since (its reply is returned:
-- this call's own grant, if any, is lost to the caller).
local base = KEYS[1]
local algo = ARGV[1]
local P = tonumber(ARGV[2])
local R = tonumber(ARGV[3])
local now = clock(ARGV[4])

-- fdiv and cdiv come from prelude.lua, prepended when the script is built.
local function ms(us) -- microseconds to a PEXPIRE argument, rounded up, with grace
  return cdiv(us, 1000) + 1000
end

local inst = ARGV[12]
local seq = tonumber(ARGV[13])
local ikey = base .. 'i:' .. inst
if inst ~= '' then
  local last = redis.call('HMGET', ikey, 's', 'g', 'x', 'e', 'n', 'r', 'z')
  if last[1] and tonumber(last[1]) >= seq then
    -- 1: this very call was applied and its reply is replayed; 2: a later
    -- call of the instance was applied since, and its reply is returned.
    local replay = 1
    if tonumber(last[1]) > seq then replay = 2 end
    return {tonumber(last[2]), tonumber(last[3]), tonumber(last[4]), tonumber(last[5]), tonumber(last[6]), tonumber(last[7]), replay}
  end
end

local idx = fdiv(now, P)
local ws = idx * P
local e = now - ws
local span = P -- how long a counter matters after its window ends
if algo == 'sw' then span = 2 * P end
local function wkey(i) return base .. algo .. ':' .. i end
local function ttl(i) return ms(i * P + span - now) end -- until window i stops mattering

local refund_idx, refund = tonumber(ARGV[5]), tonumber(ARGV[6])
if refund > 0 and refund_idx >= idx - 1 then
  local k = wkey(refund_idx)
  local c = tonumber(redis.call('GET', k) or '-1')
  if c >= 0 then
    local left = c - refund
    if left < 0 then left = 0 end
    redis.call('SET', k, left, 'KEEPTTL')
  end
end

local use_idx, use = tonumber(ARGV[7]), tonumber(ARGV[8])
-- credit estimated on a clock slightly ahead may name the next window
if use > 0 and use_idx >= idx - 1 and use_idx <= idx + 1 then
  local k = wkey(use_idx)
  redis.call('INCRBY', k, use)
  redis.call('PEXPIRE', k, ttl(use_idx))
end

local curr = tonumber(redis.call('GET', wkey(idx)) or '0')
local prev = 0
if algo == 'sw' then prev = tonumber(redis.call('GET', wkey(idx - 1)) or '0') end
local est = fdiv(prev * (P - e), P) + curr

local want, minimum, n = tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11])
if minimum < 1 then minimum = 1 end
if n < 1 then n = 1 end
local grant, retry = 0, 0
local avail = R - est
if want > 0 then
  if avail >= minimum then
    grant = want
    local cap = fdiv(avail, n)
    if cap < minimum then cap = minimum end
    if grant > cap then grant = cap end
    if grant > avail then grant = avail end
    if grant < minimum then grant = minimum end
    redis.call('INCRBY', wkey(idx), grant)
    redis.call('PEXPIRE', wkey(idx), ttl(idx))
    est = est + grant
  else
    -- the earliest time min units could fit, as global computes RetryAfter
    local function first(c, room)
      local f = P - cdiv((room + 1) * P, c) + 1
      if f < 0 then f = 0 end
      return f
    end
    if algo == 'fw' then
      retry = P - e
    else
      local room = R - curr - minimum
      if room >= 0 then
        retry = first(prev, room) - e
      else
        retry = (P - e) + first(curr, R - minimum)
      end
    end
    if retry < 1 then retry = 1 end
  end
end

local reset = P - e
if inst ~= '' then
  redis.call('HSET', ikey, 's', seq, 'g', grant, 'x', idx, 'e', est, 'n', now, 'r', retry, 'z', reset)
  redis.call('PEXPIRE', ikey, ms(2 * P + 10000000))
end
return {grant, idx, est, now, retry, reset, 0}
