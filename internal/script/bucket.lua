-- Bucket lease primitive of the hybrid limiter, on the state global's
-- TokenBucket and GCRA scripts keep (same key, same encoding). One atomic
-- call per key: give back unused tokens, charge tokens admitted on credit
-- (even below empty: an overdraft, paid back by the refill), and take a
-- slice of the tokens the bucket holds now.
--
-- KEYS[1]  key base "<prefix>:{<tag>}:"
-- ARGV[1]  "tb" or "gcra"
-- ARGV[2]  the state's kind (script.Kind): the key is KEYS[1] .. kind
-- ARGV[3..5]  tb: R, P (microseconds), C = B * P (one token is P units, the
--          refill R units per microsecond); gcra: T = floor(P / R),
--          tau = B * T, unused
-- ARGV[6]  now in microseconds, or -1 to read TIME
-- ARGV[7]  the call's nonce ("" keeps no record; gcra keeps none: its
--          state is global's string)
-- ARGV[8]  1 when the call is sent again after its reply was lost
-- ARGV[9]  instances sharing the bucket (caps a grant at a share of it)
-- ARGV[10] want: tokens wanted (0: none)   ARGV[11] min: the least worth having
-- ARGV[12] refund: unused tokens to give back (never above the capacity)
-- ARGV[13] use: tokens admitted without a grant, to take now even below empty
--
-- Returns {grant, level, retry, full, flag}: the tokens granted; the whole
-- tokens the bucket holds after the call (negative in an overdraft); when
-- grant < min, the microseconds until min tokens are in it; the
-- microseconds until it is full; flag as the window lease script's (0
-- applied, 1 replayed, 2 resent and unknown: only the use applied).
local base, algo, kind = KEYS[1], ARGV[1], ARGV[2]
local a3, a4, a5 = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local now = clock(ARGV[6])
local nonce, resent = ARGV[7], ARGV[8] == '1'
local n = tonumber(ARGV[9])
if n < 1 then n = 1 end
local want, minimum = tonumber(ARGV[10]), tonumber(ARGV[11])
if minimum < 1 then minimum = 1 end
local refund, use = tonumber(ARGV[12]), tonumber(ARGV[13])
local key = base .. kind

-- The bucket as tokens: level (whole tokens, may be negative), and the
-- operations on it, whatever the algorithm.
local level, take, write, retry_for, full
if algo == 'tb' then
  local R, P, C = a3, a4, a5
  local st = redis.call('HMGET', key, 'u', 'ts', 'r')
  local u, ts = tonumber(st[1] or ''), tonumber(st[2] or '')
  if u == nil or ts == nil then u, ts = C, now end
  if resent and nonce ~= '' and st[3] then
    local r = st[3]
    if string.sub(r, 1, #nonce) == nonce then
      local g = tonumber(string.sub(r, #nonce + 1))
      if g then return {g, fdiv(u, P), 0, 0, 1} end
    end
  end
  local add = 0
  if now > ts then add = (now - ts) * R end
  if add >= C - u then u = C else u = u + add end
  if now > ts then ts = now end
  level = function() return fdiv(u, P) end
  take = function(t) u = u - t * P end
  if not resent and refund > 0 then
    u = u + refund * P
    if u > C then u = C end
  end
  retry_for = function(t) return cdiv(t * P - u, R) end
  full = function() return cdiv(C - u, R) end
  write = function(rec)
    if rec then
      redis.call('HSET', key, 'u', u, 'ts', ts, 'r', rec)
    else
      redis.call('HSET', key, 'u', u, 'ts', ts)
    end
    local left = C - u
    if left < 1 then left = 1 end
    redis.call('PEXPIRE', key, expiry_ms(cdiv(left, R)))
  end
else
  local T, tau = a3, a4
  local d = tat_delay(redis.call('GET', key), now) -- max(tat, now) - now
  level = function() return fdiv(tau - d, T) end
  take = function(t) d = d + t * T end
  if not resent and refund > 0 then
    d = d - refund * T
    if d < 0 then d = 0 end
  end
  retry_for = function(t) return t * T - (tau - d) end
  full = function() return d end
  write = function()
    if d > 0 then
      redis.call('SET', key, tat_string(now, d), 'PX', expiry_ms(d))
    else
      redis.call('DEL', key) -- full: the same as no state
    end
  end
end

if use > 0 then take(use) end
local grant, retry = 0, 0
if not resent and want > 0 then
  local have = level()
  if have >= minimum then
    -- at most this caller's share of what the bucket holds, but never a
    -- cascade of tiny grants: at least a quarter of the capacity shared
    -- by the instances
    local cap = fdiv(have, n)
    local capacity = a5 / a4 -- tb: C / P = B
    if algo ~= 'tb' then capacity = fdiv(a4, a3) end -- gcra: tau / T = B
    local tail = cdiv(capacity, 4 * n)
    if cap < tail then cap = tail end
    grant = want
    if grant > cap then grant = cap end
    if grant > have then grant = have end
    if grant < minimum then grant = minimum end
    take(grant)
  else
    retry = retry_for(minimum)
    if retry < 1 then retry = 1 end
  end
end
if (use > 0 or grant > 0 or (refund > 0 and not resent)) then
  local rec = nil
  if nonce ~= '' and not resent then rec = nonce .. grant end
  write(rec)
end
local flag = 0
if resent then flag = 2 end
return {grant, level(), retry, full(), flag}
