-- Shared by every script of the module; prepended to each when it is built
-- (script.New), so there is one copy of the arithmetic, the clock, the
-- expiry rule and the window-counter access.

-- floor(a/b) and ceil(a/b) for integers below 2^53, exact: a/b is rounded
-- to a double, and the result is corrected when that rounding crossed an
-- integer.
local function fdiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end
local function cdiv(a, b)
  local q = fdiv(a, b)
  if q * b < a then q = q + 1 end
  return q
end

-- clock returns the time in microseconds since the epoch: the caller's
-- (arg, from WithClock) or, when arg is empty or negative, Redis TIME.
local function clock(arg)
  local now = tonumber(arg)
  if now == nil or now < 0 then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return now
end

-- expiry_ms turns "this key matters for us more microseconds" into a
-- PEXPIRE argument: rounded up to the millisecond, plus one second of grace
-- for clock steps and slow replies.
local function expiry_ms(us)
  return cdiv(us, 1000) + 1000
end

-- first(c, room, P) is the smallest e in [0, P] at which a window counter c
-- weighted by (P - e) / P, rounded down, is at most room: when a sliding
-- window's previous count has decayed enough (docs/algorithms.md).
local function first(c, room, P)
  if c <= 0 then return 0 end
  local v = P - cdiv((room + 1) * P, c) + 1
  if v < 0 then v = 0 end
  return v
end

-- Window counters (FixedWindow fw:, SlidingWindow sw:) are strings when
-- only global limiters wrote them, and hashes when the hybrid's lease
-- script did: field c holds the count, field r the record of the last
-- lease call. Every reader and writer goes through these two functions, so
-- global and hybrid limiters count in one counter whatever its type.
local function wcount(k)
  local v = redis.pcall('GET', k)
  if type(v) == 'table' then -- WRONGTYPE: a hash
    return tonumber(redis.call('HGET', k, 'c') or '0')
  end
  return tonumber(v or '0')
end
local function wincr(k, n)
  local v = redis.pcall('INCRBY', k, n)
  if type(v) == 'table' then
    v = redis.call('HINCRBY', k, 'c', n)
  end
  return v
end

-- wkey names the counter of window i: base .. kind .. ':' .. i, with i
-- written as an integer (tostring would use an exponent past 1e14).
local function wkey(base, kind, i)
  return base .. kind .. ':' .. string.format('%d', i)
end

-- GCRA's theoretical arrival time tat can pass 2^53 microseconds (now plus
-- a tolerance of decades), so it is never formed as a double: it is kept as
-- its decimal digits and handled as d = max(tat, now) - now, a duration.
-- tat_delay reads d from the stored string s (absent: 0); tat_string writes
-- now + d back, in two halves of 8 digits.
local E8 = 100000000
local function tat_delay(s, now)
  if not s then return 0 end
  local nh = fdiv(now, E8)
  local nl = now - nh * E8
  local hi, lo = 0, tonumber(s)
  if string.len(s) > 8 then
    hi = tonumber(string.sub(s, 1, -9))
    lo = tonumber(string.sub(s, -8))
  end
  if not (hi and lo) then return 0 end
  local d = (hi - nh) * E8 + (lo - nl)
  if d < 0 then d = 0 end
  return d
end
local function tat_string(now, d)
  local nh = fdiv(now, E8)
  local nl = now - nh * E8
  local dh = fdiv(d, E8)
  local lo = nl + (d - dh * E8)
  local hi = nh + dh
  if lo >= E8 then
    lo = lo - E8
    hi = hi + 1
  end
  if hi > 0 then return string.format('%d%08d', hi, lo) end
  return string.format('%d', lo)
end
