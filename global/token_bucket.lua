-- TokenBucket (algorithms.lua), one limit.
--
-- KEYS[1]  "<prefix>:{<tag>}:"; the state is the hash KEYS[1] .. kind
--          with fields u (content in units) and ts (time of u, microseconds).
-- ARGV[1]  now in microseconds, or "" / -1 to read Redis TIME
-- ARGV[2]  n   ARGV[3]  R   ARGV[4]  P (microseconds)   ARGV[5]  C = B * P
-- ARGV[6]  kind (script.Kind: the algorithm and the limit)
--
-- Returns {allowed (0/1), remaining, retry_after_us, reset_after_us}.
local L = {key = KEYS[1] .. ARGV[6], R = tonumber(ARGV[3]), P = tonumber(ARGV[4]), C = tonumber(ARGV[5])}
return single(token_bucket(L, clock(ARGV[1]), tonumber(ARGV[2])))
