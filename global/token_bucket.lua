-- TokenBucket, exactly as docs/algorithms.md says, in integer microseconds.
-- One token is P units, so the refill is exactly R units per microsecond.
--
-- KEYS[1]  "<prefix>:{<tag>}:"; the state is the hash KEYS[1] .. ARGV[6]
--          with fields u (content in units) and ts (time of u, microseconds).
-- ARGV[1]  now in microseconds, or "" / -1 to read Redis TIME
-- ARGV[2]  n   ARGV[3]  R   ARGV[4]  P (microseconds)   ARGV[5]  C = B * P
-- ARGV[6]  kind (script.Kind: the algorithm and the limit)
--
-- Returns {allowed (0/1), remaining, retry_after_us, reset_after_us}.
-- Every quantity is an integer <= 2^53, exact in a Lua double. A denied
-- request writes nothing.

-- fdiv, cdiv, clock and expiry_ms come from internal/script/prelude.lua,
-- prepended when the script is built.

local now = clock(ARGV[1])
local n = tonumber(ARGV[2])
local R = tonumber(ARGV[3])
local P = tonumber(ARGV[4])
local C = tonumber(ARGV[5])

local key = KEYS[1] .. ARGV[6]
local st = redis.call('HMGET', key, 'u', 'ts')
local u = tonumber(st[1] or '')
local ts = tonumber(st[2] or '')
if u == nil or ts == nil then
  u = C
  ts = now
end

-- u = min(C, u + max(0, now - ts) * R), the product capped: when it would
-- exceed C - u the bucket is simply full. (A double product that is not
-- exact is far above C - u, so the comparison still decides right.)
local add = 0
if now > ts then add = (now - ts) * R end
if add >= C - u then
  u = C
else
  u = u + add
end
if now > ts then ts = now end

local need = n * P
local allowed = 0
if u >= need then
  u = u - need
  redis.call('HSET', key, 'u', u, 'ts', ts)
  redis.call('PEXPIRE', key, expiry_ms(cdiv(C - u, R)))
  allowed = 1
end

local retry = 0
if allowed == 0 then retry = cdiv(need - u, R) end
return {allowed, fdiv(u, P), retry, cdiv(C - u, R)}
