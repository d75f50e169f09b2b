-- Heartbeat of the hybrid limiter's instances: registers (ARGV[3] = 1) or
-- removes (0) instance ARGV[1] in the sorted set KEYS[1], scored by server
-- time in ms; drops instances silent for ARGV[2] ms; returns how many remain.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local live = tonumber(ARGV[2])
if ARGV[3] == '1' then
  redis.call('ZADD', KEYS[1], now, ARGV[1])
else
  redis.call('ZREM', KEYS[1], ARGV[1])
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - live)
redis.call('PEXPIRE', KEYS[1], 2 * live)
return redis.call('ZCARD', KEYS[1])
