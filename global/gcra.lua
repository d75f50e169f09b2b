-- GCRA, exactly as docs/algorithms.md says, in integer microseconds.
--
-- KEYS[1]  "<prefix>:{<tag>}:"; the state is the string KEYS[1] .. ARGV[5]
--          holding tat, the theoretical arrival time in microseconds, in
--          decimal.
-- ARGV[1]  now in microseconds, or "" / -1 to read Redis TIME
-- ARGV[2]  n   ARGV[3]  T = floor(P/R)   ARGV[4]  tau = B * T
-- ARGV[5]  kind (script.Kind: the algorithm and the limit)
--
-- Returns {allowed (0/1), remaining, retry_after_us, reset_after_us}.
-- A denied request writes nothing.
--
-- Exactness: T, tau, n*T and d = tat - now are integers <= 2^53, exact in a
-- Lua double, but tat itself (now + up to tau) can exceed 2^53 when B*T is
-- long (decades), so tat is never formed as a double: it is read and
-- written as a decimal string in two halves of 8 digits, and the script
-- works with d. ntat - now is d + n*T; ntat - tau - now is n*T - (tau - d).

-- fdiv, cdiv, clock and expiry_ms come from internal/script/prelude.lua,
-- prepended when the script is built.

local now = clock(ARGV[1])
local n = tonumber(ARGV[2])
local T = tonumber(ARGV[3])
local tau = tonumber(ARGV[4])

local E = 100000000 -- 10^8: tat = hi * E + lo
local nh = fdiv(now, E)
local nl = now - nh * E

local key = KEYS[1] .. ARGV[5]
-- d = max(tat, now) - now; an absent key has tat = now.
local d = 0
local s = redis.call('GET', key)
if s then
  local hi, lo = 0, tonumber(s)
  if string.len(s) > 8 then
    hi = tonumber(string.sub(s, 1, -9))
    lo = tonumber(string.sub(s, -8))
  end
  if hi and lo then
    d = (hi - nh) * E + (lo - nl)
    if d < 0 then d = 0 end
  end
end

local nT = n * T
local allowed = 0
local retry = 0
if d + nT <= tau then -- ntat - now <= tau
  d = d + nT
  local dh = fdiv(d, E)
  local lo = nl + (d - dh * E)
  local hi = nh + dh
  if lo >= E then
    lo = lo - E
    hi = hi + 1
  end
  local tat
  if hi > 0 then
    tat = string.format('%d%08d', hi, lo)
  else
    tat = string.format('%d', lo)
  end
  redis.call('SET', key, tat, 'PX', expiry_ms(d))
  allowed = 1
else
  retry = nT - (tau - d)
end

local remaining = fdiv(tau - d, T)
if remaining < 0 then remaining = 0 end
return {allowed, remaining, retry, d}
