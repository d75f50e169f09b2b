-- SlidingWindow, the two-window weighted counter (algorithms.lua), one
-- limit.
--
-- KEYS[1]  "<prefix>:{<tag>}:"; the counters are wkey(KEYS[1], kind, i)
--          for the current window i = ws/P, the previous one and the next.
-- ARGV[1]  now in microseconds, or "" / -1 to read Redis TIME
-- ARGV[2]  n   ARGV[3]  R   ARGV[4]  P (microseconds)
-- ARGV[5]  kind (script.Kind: the algorithm and the rate)
-- ARGV[6]  optional: the window of a charge   ARGV[7]  its events: what
--          the caller admitted without Redis in that window, added to its
--          counter first when it is the current window (charge_window)
--
-- Returns {allowed (0/1), remaining, retry_after_us, reset_after_us}, and
-- with a charge a fifth value: 1 when it was applied, else 0.
local L = {kind = ARGV[5], R = tonumber(ARGV[3]), P = tonumber(ARGV[4])}
local now = clock(ARGV[1])
if ARGV[7] == nil then
  return single(sliding_window(KEYS[1], L, now, tonumber(ARGV[2])))
end
local charged = charge_window(KEYS[1], L, now, tonumber(ARGV[6]), tonumber(ARGV[7]), 2 * L.P)
local out = single(sliding_window(KEYS[1], L, now, tonumber(ARGV[2])))
out[5] = charged and 1 or 0
return out
