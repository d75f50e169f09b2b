-- FixedWindow, exactly as docs/algorithms.md says, in integer microseconds.
--
-- KEYS[1]  "<prefix>:{<tag>}:"; the counter is KEYS[1] .. "fw:<ws/P>".
-- ARGV[1]  now in microseconds, or "" / -1 to read Redis TIME
-- ARGV[2]  n   ARGV[3]  R   ARGV[4]  P (microseconds)
--
-- Returns {allowed (0/1), remaining, retry_after_us, reset_after_us}.
-- Every quantity is an integer <= 2^53, exact in a Lua double. A denied
-- request writes nothing.

-- floor(a/b) and ceil(a/b) for integers, corrected for the rounding of a/b.
local function fdiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end
local function cdiv(a, b)
  local q = fdiv(a, b)
  if q * b < a then q = q + 1 end
  return q
end

local now = tonumber(ARGV[1])
if now == nil or now < 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local n = tonumber(ARGV[2])
local R = tonumber(ARGV[3])
local P = tonumber(ARGV[4])

local idx = fdiv(now, P)
local e = now - idx * P -- elapsed in the window; ws + P - now = P - e
local key = KEYS[1] .. 'fw:' .. string.format('%d', idx)

local count = tonumber(redis.call('GET', key) or '0')
local allowed = 0
if count + n <= R then
  count = redis.call('INCRBY', key, n)
  redis.call('PEXPIRE', key, cdiv(P - e, 1000) + 1000)
  allowed = 1
end

local remaining = R - count
if remaining < 0 then remaining = 0 end
local reset = P - e
local retry = 0
if allowed == 0 then retry = reset end
return {allowed, remaining, retry, reset}
