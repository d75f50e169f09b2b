-- SlidingLog (algorithms.lua), one limit.
--
-- KEYS[1]  "<prefix>:{<tag>}:"; the log is the sorted set KEYS[1] .. kind,
--          its member sequence KEYS[1] .. kind .. ":seq".
-- ARGV[1]  now in microseconds, or "" / -1 to read Redis TIME
-- ARGV[2]  n   ARGV[3]  R   ARGV[4]  P (microseconds)
-- ARGV[5]  kind (script.Kind: the algorithm and the limit)
--
-- Returns {allowed (0/1), remaining, retry_after_us, reset_after_us}.
local L = {key = KEYS[1] .. ARGV[5], R = tonumber(ARGV[3]), P = tonumber(ARGV[4])}
return single(sliding_log(L, clock(ARGV[1]), tonumber(ARGV[2])))
