-- SlidingWindow (two-window weighted counter), exactly as
-- docs/algorithms.md says, in integer microseconds.
--
-- KEYS[1]  "<prefix>:{<tag>}:"; the counters are KEYS[1] .. "sw:<ws/P>"
--          (current window) and KEYS[1] .. "sw:<ws/P - 1>" (previous).
-- ARGV[1]  now in microseconds, or "" / -1 to read Redis TIME
-- ARGV[2]  n   ARGV[3]  R   ARGV[4]  P (microseconds)
--
-- Returns {allowed (0/1), remaining, retry_after_us, reset_after_us}.
-- Every quantity is an integer <= 2^53, exact in a Lua double. A denied
-- request writes nothing.

-- fdiv and cdiv come from prelude.lua, prepended when the script is built.

local now = clock(ARGV[1])
local n = tonumber(ARGV[2])
local R = tonumber(ARGV[3])
local P = tonumber(ARGV[4])

local idx = fdiv(now, P)
local e = now - idx * P -- elapsed in the window; ws + P - now = P - e
local ckey = KEYS[1] .. 'sw:' .. string.format('%d', idx)
local pkey = KEYS[1] .. 'sw:' .. string.format('%d', idx - 1)

local vals = redis.call('MGET', ckey, pkey)
local curr = tonumber(vals[1] or '0')
local prev = tonumber(vals[2] or '0')

local est = fdiv(prev * (P - e), P) + curr
local allowed = 0
if est + n <= R then
  redis.call('INCRBY', ckey, n)
  redis.call('PEXPIRE', ckey, cdiv(2 * P - e, 1000) + 1000)
  curr = curr + n
  est = est + n
  allowed = 1
end

-- first(c, room): the smallest e' in [0, P] with floor(c*(P-e')/P) <= room.
local function first(c, room)
  if c <= 0 then return 0 end
  local v = P - cdiv((room + 1) * P, c) + 1
  if v < 0 then v = 0 end
  return v
end

local remaining = R - est
if remaining < 0 then remaining = 0 end
local reset = P - e
local retry = 0
if allowed == 0 then
  local room = R - curr - n
  if room >= 0 then
    retry = first(prev, room) - e
  else
    retry = (P - e) + first(curr, R - n)
  end
end
return {allowed, remaining, retry, reset}
