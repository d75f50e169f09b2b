-- GCRA (algorithms.lua), one limit.
--
-- KEYS[1]  "<prefix>:{<tag>}:"; the state is the string KEYS[1] .. kind
--          holding tat, the theoretical arrival time in microseconds, as
--          its exact decimal digits.
-- ARGV[1]  now in microseconds, or "" / -1 to read Redis TIME
-- ARGV[2]  n   ARGV[3]  T = floor(P/R)   ARGV[4]  tau = B * T
-- ARGV[5]  kind (script.Kind: the algorithm and the limit)
--
-- Returns {allowed (0/1), remaining, retry_after_us, reset_after_us}.
local L = {key = KEYS[1] .. ARGV[5], T = tonumber(ARGV[3]), tau = tonumber(ARGV[4])}
return single(gcra(L, clock(ARGV[1]), tonumber(ARGV[2])))
