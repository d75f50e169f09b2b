-- GCRA, exactly as docs/algorithms.md says, in integer microseconds.
--
-- KEYS[1]  "<prefix>:{<tag>}:"; the state is the string KEYS[1] .. "gcra"
--          holding tat, the theoretical arrival time in microseconds.
-- ARGV[1]  now in microseconds, or "" / -1 to read Redis TIME
-- ARGV[2]  n   ARGV[3]  T = floor(P/R)   ARGV[4]  tau = B * T
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
local T = tonumber(ARGV[3])
local tau = tonumber(ARGV[4])

local key = KEYS[1] .. 'gcra'
local tat = tonumber(redis.call('GET', key) or '')
if tat == nil or tat < now then tat = now end

local ntat = tat + n * T
local allowed = 0
if ntat - now <= tau then
  tat = ntat
  redis.call('SET', key, tat, 'PX', cdiv(tat - now, 1000) + 1000)
  allowed = 1
end

local remaining = fdiv(tau - (tat - now), T)
if remaining < 0 then remaining = 0 end
local retry = 0
if allowed == 0 then retry = ntat - tau - now end
return {allowed, remaining, retry, tat - now}
