-- Exact accounting of one decision of the hybrid limiter on a key it sees
-- seldom (a cold key), for FixedWindow: as global's FixedWindow script,
-- n units are added to the current window's counter when they fit under
-- the limit, and a denial changes nothing. The counter is the one global's
-- script and the lease script count in, whatever its type. Lighter than
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
-- Returns {idx, now, count, admitted, adjusted}: the window counted in,
-- the time used, the window's count after the call, 1 when the n units
-- were added (else 0), and 1 when the adjustment was applied (its window
-- is the current one).
local base, kind = KEYS[1], ARGV[1]
local P, R = tonumber(ARGV[2]), tonumber(ARGV[3])
local now = clock(ARGV[4])
local n = tonumber(ARGV[5])
local adj_idx, refund, use = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local idx = fdiv(now, P)
local k = wkey(base, kind, idx)
local c = wcount(k)
local fresh = c == 0 -- the counter may not exist: set its expiry if written
local adjusted = 0
if adj_idx == idx and (refund > 0 or use > 0) then
  local d = use - refund
  if c + d < 0 then d = -c end
  if d ~= 0 then c = wincr(k, d) end
  adjusted = 1
end
local admitted = 0
if c + n <= R then
  c = wincr(k, n)
  admitted = 1
end
if fresh and c > 0 then
  redis.call('PEXPIRE', k, expiry_ms((idx + 1) * P - now))
end
return {idx, now, c, admitted, adjusted}
