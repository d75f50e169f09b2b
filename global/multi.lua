-- Several limits on one key, all or nothing, and the settlement of
-- reservations: docs/algorithms.md, in integer microseconds, with the
-- algorithms of algorithms.lua, exactly as the single-limit scripts and
-- package local.
--
-- KEYS[1]  "<prefix>:{<tag>}:", the base of every key of the user key: all
--          of them hash to one Cluster slot.
-- ARGV[1]  op: "take" decides n events (AllowN, Reserve); "settle" settles
--          a reservation of n events
-- ARGV[2]  now in microseconds, or "" / -1 to read Redis TIME
-- ARGV[3]  n: the events asked for, or the estimate being settled
-- ARGV[4]  settle: the actual events
-- ARGV[5]  settle: t0, the instant (microseconds) the reservation was taken
-- ARGV[6]  settle: the reservation's id, naming its record KEYS[1] .. 'rsv:' .. id
-- ARGV[7]  settle: 1 when a refund must not be given (a retry so late that
--          the first attempt's record may be gone), else 0
-- ARGV[8]  settle: the record's time to live, milliseconds
-- ARGV[9]  k, the number of limits; then five values per limit:
--          algorithm (0 FixedWindow, 1 SlidingWindow, 2 SlidingLog,
--          3 TokenBucket, 4 GCRA), kind (script.Kind of the algorithm and
--          the limit: the state's key suffix), R, P (microseconds), B (the
--          capacity)
-- ARGV[10 + 5k ..] take, optional: two values per limit, what the caller
--          admitted without Redis, charged first, past the limit: the
--          window it was admitted in (for a window limit; only while it
--          is the current one) and the events (0: none). A bucket's
--          charge is an overdraft it refills; a SlidingLog's is dropped.
--
-- take returns {now, allowed (0/1), then per limit: allowed alone (0/1),
-- remaining, retry_after_us, reset_after_us}, and with charges one value
-- more per limit: 1 when its charge was applied, else 0. Every limit is asked before
-- any is written: a denial writes nothing. A limit that allows in a denied
-- decision reports its state as it stands; in an admitted one, after it.
--
-- settle returns {now, status, actual}: status 0 applied now; 1 the record
-- says it was applied before with this actual (nothing done); 2 it was
-- applied before with another actual, returned (nothing done).
--
-- Every quantity is an integer <= 2^53, exact in a Lua double: overdrafts
-- saturate (window counts at 2^53, a bucket's debt at 2^53 units, GCRA's at
-- tat - now = 2^53 - tau), and instants that can pass 2^53 (GCRA's tat) are
-- never formed as doubles.

local MAX = 9007199254740992 -- 2^53

local now = clock(ARGV[2])
local n = tonumber(ARGV[3])

-- The limits, as algorithms.lua takes them.
local limits = {}
local k = tonumber(ARGV[9])
for i = 1, k do
  local j = 9 + (i - 1) * 5
  local L = {alg = tonumber(ARGV[j + 1]), kind = ARGV[j + 2], R = tonumber(ARGV[j + 3]),
    P = tonumber(ARGV[j + 4]), B = tonumber(ARGV[j + 5])}
  L.key = KEYS[1] .. L.kind
  L.C = L.B * L.P
  L.span = L.P -- how long a window counter matters from its window's start
  if L.alg == 1 then L.span = 2 * L.P end
  if L.alg == 4 then
    L.T = fdiv(L.P, L.R)
    L.tau = L.B * L.T
  end
  limits[i] = L
end

local function decide(L)
  if L.alg == 0 then return fixed_window(KEYS[1], L, now, n) end
  if L.alg == 1 then return sliding_window(KEYS[1], L, now, n) end
  if L.alg == 2 then return sliding_log(L, now, n) end
  if L.alg == 3 then return token_bucket(L, now, n) end
  return gcra(L, now, n)
end

-- bucket_over and gcra_over take over events from a bucket's content u
-- or GCRA's delay d, past empty, saturating at the deepest debt.
local function bucket_over(L, u, over)
  local lo = L.C - MAX -- the deepest debt: C - u <= 2^53
  if over * L.P > u - lo then return lo end
  return u - over * L.P
end
local function gcra_over(L, d, over)
  local hi = MAX - L.tau -- the deepest debt: d + n*T <= 2^53
  local room = hi - d
  if room < 0 then room = 0 end
  if over * L.T > room then
    if d < hi then d = hi end
    return d
  end
  return d + over * L.T
end

-- settle gives est - actual back to limit L where it was taken from while
-- that still counts (unless norefund), or charges actual - est now, past
-- the limit: docs/algorithms.md, "Reserve and settle".
local function settle(L, t0, est, actual, norefund)
  local P, R = L.P, L.R
  local refund, over = est - actual, actual - est
  if norefund then refund = 0 end
  if L.alg <= 1 then -- the windows
    local idx = fdiv(now, P)
    local idx0 = fdiv(t0, P)
    if refund > 0 and (idx0 == idx or (L.alg == 1 and idx0 == idx - 1)) then
      local key = wkey(KEYS[1], L.kind, idx0)
      local c = wcount(key)
      if c > 0 then -- a refund keeps the key's expiry
        local back = refund
        if back > c then back = c end
        wincr(key, -back)
      end
    end
    if over > 0 then window_over(KEYS[1], L, now, over, L.span) end
  elseif L.alg == 3 then
    local C = L.C
    local u, ts = bucket(L, now)
    if refund > 0 then
      -- what the bucket has not refilled by itself since t0
      local units, el = refund * P, now - t0
      if el < 0 then el = 0 end
      if el < cdiv(units, R) then
        u = u + units - el * R
        if u > C then u = C end
      end
    end
    if over > 0 then u = bucket_over(L, u, over) end
    put_bucket(L, u, ts)
  elseif L.alg == 4 then
    local T = L.T
    local d = gcra_d(L, now)
    if refund > 0 then
      local el = now - t0
      if el < 0 then el = 0 end
      local back = refund * T - el
      if back > 0 then
        d = d - back
        if d < 0 then d = 0 end
      end
    end
    if over > 0 then d = gcra_over(L, d, over) end
    put_gcra(L, now, d)
  end
end

if ARGV[1] == 'settle' then
  local actual, t0 = tonumber(ARGV[4]), tonumber(ARGV[5])
  local rkey = KEYS[1] .. 'rsv:' .. ARGV[6]
  local rec = redis.call('GET', rkey)
  if rec then
    local was = tonumber(rec)
    if was == actual then return {now, 1, was} end
    return {now, 2, was}
  end
  for i = 1, k do
    settle(limits[i], t0, n, actual, ARGV[7] == '1')
  end
  redis.call('SET', rkey, string.format('%d', actual), 'PX', tonumber(ARGV[8]))
  return {now, 0, actual}
end

-- charge applies use events the caller admitted without Redis to limit
-- L (in window idx0, for a window limit) and reports whether it did.
local function charge(L, idx0, use)
  if use <= 0 then return false end
  if L.alg <= 1 then return charge_window(KEYS[1], L, now, idx0, use, L.span) end
  if L.alg == 3 then
    local u, ts = bucket(L, now)
    put_bucket(L, bucket_over(L, u, use), ts)
    return true
  end
  if L.alg == 4 then
    put_gcra(L, now, gcra_over(L, gcra_d(L, now), use))
    return true
  end
  return false -- SlidingLog: a log of at most R events holds no debt
end

-- The charges first, then the decision, which sees them.
local charged = nil
local cj = 10 + 5 * k
if ARGV[cj + 2 * k - 1] ~= nil then
  charged = {}
  for i = 1, k do
    local j = cj + 2 * (i - 1)
    charged[i] = charge(limits[i], tonumber(ARGV[j]), tonumber(ARGV[j + 1])) and 1 or 0
  end
end

-- Every limit is asked first; only when all admit n is each consumed.
local out = {now, 1}
local commits = {}
local all = true
for i = 1, k do
  local fits, remaining, retry, reset, commit = decide(limits[i])
  if remaining < 0 then remaining = 0 end
  out[#out + 1] = fits and 1 or 0
  out[#out + 1] = remaining
  out[#out + 1] = retry
  out[#out + 1] = reset
  commits[i] = commit
  all = all and fits
end
if all then
  for i = 1, k do
    local remaining, reset = commits[i]()
    if remaining < 0 then remaining = 0 end
    out[2 + (i - 1) * 4 + 2] = remaining
    out[2 + (i - 1) * 4 + 4] = reset
  end
else
  out[2] = 0
end
if charged then
  for i = 1, k do out[#out + 1] = charged[i] end
end
return out
