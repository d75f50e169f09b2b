-- FixedWindow, exactly as docs/algorithms.md says, in integer microseconds.
--
-- KEYS[1]  "<prefix>:{<tag>}:"; the counter is wkey(KEYS[1], kind, ws/P).
-- ARGV[1]  now in microseconds, or "" / -1 to read Redis TIME
-- ARGV[2]  n   ARGV[3]  R   ARGV[4]  P (microseconds)   ARGV[5]  kind (script.Kind: the algorithm and the rate)
--
-- Returns {allowed (0/1), remaining, retry_after_us, reset_after_us}.
-- Every quantity is an integer <= 2^53, exact in a Lua double. A denied
-- request writes nothing. The counter may be a hybrid limiter's hash:
-- wcount and wincr (prelude.lua) read and count in either form.

local now = clock(ARGV[1])
local n = tonumber(ARGV[2])
local R = tonumber(ARGV[3])
local P = tonumber(ARGV[4])

local idx = fdiv(now, P)
local e = now - idx * P -- elapsed in the window; ws + P - now = P - e
local key = wkey(KEYS[1], ARGV[5], idx)

local count = wcount(key)
local allowed = 0
if count + n <= R then
  count = wincr(key, n)
  redis.call('PEXPIRE', key, expiry_ms(P - e))
  allowed = 1
end

local remaining = R - count
if remaining < 0 then remaining = 0 end
local reset = P - e
local retry = 0
if allowed == 0 then retry = reset end
return {allowed, remaining, retry, reset}
