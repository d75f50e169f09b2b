-- Exact accounting of one decision of the hybrid limiter on a key it sees
-- seldom (a cold key), for FixedWindow: as global's FixedWindow script,
-- n units are added to the current window's counter when they fit under
-- the limit, and a denial changes nothing. The counter is the one global's
-- scripts and the lease script count in, whatever its type. Lighter than
-- the lease script: no replay record (a take is never sent twice), nothing
-- to size.
--
-- What the caller owes the window first goes in (see lease.lua's
-- adjustments): units it took earlier and gives back (a decision of
-- several limits that another limit denied; never below zero), and units
-- it admitted on credit (a reservation settled for more), when the window
-- is the current one.
--
-- KEYS[1]  key base "<prefix>:{<tag>}:"
-- ARGV[1]  counter kind ("fw:<R>"); window i's counter is KEYS[1] .. kind .. ':' .. i
-- ARGV[2]  P, the period in microseconds      ARGV[3]  R, the rate
-- ARGV[4]  now in microseconds, or -1 to read TIME
-- ARGV[5]  n, the units of the decision
-- ARGV[6]  the window of the adjustment   ARGV[7]  units given back
-- ARGV[8]  units of credit
--
-- It stands alone, without the shared prelude: a call defines only the
-- few values it needs (a chunk's every local function is made anew on
-- each call), which keeps it a few microseconds of Redis CPU. Its window
-- arithmetic and counter access are the prelude's (fdiv, clock,
-- expiry_ms, wkey, wcount, wincr), written out.
--
-- Returns {idx, now, count, admitted, adjusted}: the window counted in,
-- the time used, the window's count after the call, 1 when the n units
-- were added (else 0), and 1 when the adjustment was applied (its window
-- is the current one).
local base, kind = KEYS[1], ARGV[1]
local P, R = tonumber(ARGV[2]), tonumber(ARGV[3])
local now = tonumber(ARGV[4])
if now == nil or now < 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local n = tonumber(ARGV[5])
local adj_idx, refund, use = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
-- idx = floor(now / P), exact below 2^53
local idx = math.floor(now / P)
if idx * P > now then idx = idx - 1 elseif (idx + 1) * P <= now then idx = idx + 1 end
local k = base .. kind .. ':' .. string.format('%d', idx)
-- the counter: a hash (field c) the lease script, the hybrid's and
-- global's plain increments and this script write, or a string other
-- scripts of global write. Written blind (HINCRBY, which meets WRONGTYPE
-- on a string), so that an admission costs one command, not a read and a
-- write; what lands over the limit is taken back at once. A counter this
-- script makes is a hash, so that the plain increments, which are
-- HINCRBY, can follow.
local hash = nil -- not known yet
local function incr(d)
  if hash ~= false then
    local v = redis.pcall('HINCRBY', k, 'c', d)
    if type(v) ~= 'table' then
      hash = true
      return tonumber(v)
    end
    hash = false
  end
  return tonumber(redis.call('INCRBY', k, d))
end
local fresh = false -- the counter was 0 (or absent): set its expiry
local c = nil
local function write(d)
  local after = incr(d)
  if c == nil and after == d then fresh = true end
  c = after
end
local function read()
  local v = redis.pcall('HGET', k, 'c')
  if type(v) == 'table' then
    hash = false
    v = redis.call('GET', k)
  end
  return tonumber(v or '0')
end
local adjusted = 0
if adj_idx == idx and (refund > 0 or use > 0) then
  local d = use - refund
  if d < 0 then
    c = read()
    if c + d < 0 then d = -c end -- never below zero
  end
  if d ~= 0 then write(d) end
  adjusted = 1
end
local admitted = 0
if n > 0 then
  write(n)
  if c > R then
    c = incr(-n)
  else
    admitted = 1
  end
elseif c == nil then
  c = read()
end
if fresh and c > 0 then
  -- the window's end, rounded up to the millisecond, and a second of grace
  local left = (idx + 1) * P - now
  redis.call('PEXPIRE', k, math.floor((left + 999) / 1000) + 1000)
end
return {idx, now, c, admitted, adjusted}
