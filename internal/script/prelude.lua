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
