-- SlidingLog, exactly as docs/algorithms.md says, in integer microseconds.
--
-- KEYS[1]  "<prefix>:{<tag>}:"; the log is the sorted set KEYS[1] .. kind
--          (score: admission time in microseconds; member: a unique number
--          from the counter KEYS[1] .. kind .. ":seq").
-- ARGV[1]  now in microseconds, or "" / -1 to read Redis TIME
-- ARGV[2]  n   ARGV[3]  R   ARGV[4]  P (microseconds)   ARGV[5]  kind
--
-- Returns {allowed (0/1), remaining, retry_after_us, reset_after_us}.
-- Every quantity is an integer <= 2^53, exact in a Lua double. A denied
-- request writes nothing (stale entries are dropped only by an admission).
-- Instants t + P can exceed 2^53 for a long Period, so they are computed
-- as P - (now - t), whose terms cannot.

-- fdiv, cdiv, clock and expiry_ms come from internal/script/prelude.lua,
-- prepended when the script is built.

local now = clock(ARGV[1])
local n = tonumber(ARGV[2])
local R = tonumber(ARGV[3])
local P = tonumber(ARGV[4])

local log = KEYS[1] .. ARGV[5]
local seqkey = KEYS[1] .. ARGV[5] .. ':seq'
local cutoff = now - P -- entries with t <= cutoff are out of the window

local count = redis.call('ZCOUNT', log, cutoff + 1, '+inf')
local allowed = 0
if count + n <= R then
  redis.call('ZREMRANGEBYSCORE', log, '-inf', cutoff)
  local last = redis.call('INCRBY', seqkey, n)
  local m = last - n + 1
  while m <= last do
    local args = {}
    local stop = m + 499
    if stop > last then stop = last end
    for i = m, stop do
      args[#args + 1] = now
      args[#args + 1] = string.format('%d', i)
    end
    redis.call('ZADD', log, unpack(args))
    m = stop + 1
  end
  local ttl = expiry_ms(P)
  redis.call('PEXPIRE', log, ttl)
  redis.call('PEXPIRE', seqkey, ttl)
  count = count + n
  allowed = 1
end

local remaining = R - count
if remaining < 0 then remaining = 0 end
local reset = 0
if count > 0 then
  local newest = redis.call('ZRANGE', log, -1, -1, 'WITHSCORES')
  reset = P - (now - tonumber(newest[2]))
end
local retry = 0
if allowed == 0 then
  local k = count + n - R -- 1-based rank among the live entries
  local tk = redis.call('ZRANGEBYSCORE', log, cutoff + 1, '+inf', 'WITHSCORES', 'LIMIT', k - 1, 1)
  retry = P - (now - tonumber(tk[2]))
end
return {allowed, remaining, retry, reset}
