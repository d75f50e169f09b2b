-- SlidingWindow, the two-window weighted counter (algorithms.lua), one
-- limit.
--
-- KEYS[1]  "<prefix>:{<tag>}:"; the counters are wkey(KEYS[1], kind, i)
--          for the current window i = ws/P, the previous one and the next.
-- ARGV[1]  now in microseconds, or "" / -1 to read Redis TIME
-- ARGV[2]  n   ARGV[3]  R   ARGV[4]  P (microseconds)
-- ARGV[5]  kind (script.Kind: the algorithm and the rate)
--
-- Returns {allowed (0/1), remaining, retry_after_us, reset_after_us}.
local L = {kind = ARGV[5], R = tonumber(ARGV[3]), P = tonumber(ARGV[4])}
return single(sliding_window(KEYS[1], L, clock(ARGV[1]), tonumber(ARGV[2])))
