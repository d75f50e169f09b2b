-- SlidingWindow (two-window weighted counter), exactly as
-- docs/algorithms.md says, in integer microseconds.
--
-- KEYS[1]  "<prefix>:{<tag>}:"; the counters are wkey(KEYS[1], kind, i)
--          for the current window i = ws/P, the previous one (i - 1) and
--          the next (i + 1), which only a hybrid limiter's lease ahead of
--          the window's start fills.
-- ARGV[1]  now in microseconds, or "" / -1 to read Redis TIME
-- ARGV[2]  n   ARGV[3]  R   ARGV[4]  P (microseconds)   ARGV[5]  kind (script.Kind: the algorithm and the rate)
--
-- Returns {allowed (0/1), remaining, retry_after_us, reset_after_us}.
-- Every quantity is an integer <= 2^53, exact in a Lua double. A denied
-- request writes nothing.

local now = clock(ARGV[1])
local n = tonumber(ARGV[2])
local R = tonumber(ARGV[3])
local P = tonumber(ARGV[4])

local idx = fdiv(now, P)
local e = now - idx * P -- elapsed in the window; ws + P - now = P - e
local ckey = wkey(KEYS[1], ARGV[5], idx)
local curr = wcount(ckey)
local prev = wcount(wkey(KEYS[1], ARGV[5], idx - 1))
local nxt = wcount(wkey(KEYS[1], ARGV[5], idx + 1))

-- The estimate now, and what the next window will start from (the current
-- window weighted fully, plus what was leased from the next one already):
-- an admission must keep both within R.
local est = fdiv(prev * (P - e), P) + curr
local bound = est
if curr + nxt > bound then bound = curr + nxt end
local allowed = 0
if bound + n <= R then
  wincr(ckey, n)
  redis.call('PEXPIRE', ckey, expiry_ms(2 * P - e))
  curr = curr + n
  bound = bound + n
  allowed = 1
end

local remaining = R - bound
if remaining < 0 then remaining = 0 end
local reset = P - e
local retry = 0
if allowed == 0 then
  if curr + nxt + n <= R then -- the estimate binds: wait for prev to decay
    retry = first(prev, R - curr - n, P) - e
  else
    retry = (P - e) + first(curr, R - nxt - n, P) -- the next window
  end
end
return {allowed, remaining, retry, reset}
