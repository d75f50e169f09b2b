-- Shared by every script of this package; prepended to each when it is
-- built (global.go, lease.go), so there is one copy of the arithmetic.

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

