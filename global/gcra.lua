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
-- long (decades), so tat is never formed as a double (tat_delay and
-- tat_string in the prelude), and the script works with d. ntat - now is
-- d + n*T; ntat - tau - now is n*T - (tau - d).

-- fdiv, cdiv, clock, expiry_ms, tat_delay and tat_string come from
-- internal/script/prelude.lua, prepended when the script is built.

local now = clock(ARGV[1])
local n = tonumber(ARGV[2])
local T = tonumber(ARGV[3])
local tau = tonumber(ARGV[4])

local key = KEYS[1] .. ARGV[5]
local d = tat_delay(redis.call('GET', key), now) -- max(tat, now) - now

local nT = n * T
local allowed = 0
local retry = 0
if d + nT <= tau then -- ntat - now <= tau
  d = d + nT
  redis.call('SET', key, tat_string(now, d), 'PX', expiry_ms(d))
  allowed = 1
else
  retry = nT - (tau - d)
end

local remaining = fdiv(tau - d, T)
if remaining < 0 then remaining = 0 end
return {allowed, remaining, retry, d}
