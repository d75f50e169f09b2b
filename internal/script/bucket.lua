-- Bucket lease primitive of the hybrid limiter, on the state global's
-- TokenBucket and GCRA scripts keep (same key, same encoding). One atomic
-- call per key: give back unused tokens, charge tokens admitted on credit
-- (even below empty: an overdraft, paid back by the refill), and take a
-- slice of the tokens the bucket holds now.
--
-- Tokens an instance holds are still the bucket's: at every moment the
-- bucket plus what the instances hold is at most the capacity, so that no
-- stretch of time admits more than Burst + Rate x its length. Each holder
-- keeps a record of what it may hold, until when (microseconds): fields
-- "h" .. holder and "e" .. holder of the TokenBucket's own hash, or of the
-- hash KEYS[1] .. kind .. ':held' beside a GCRA's string. The bucket
-- refills only up to the capacity less the tokens the records hold, and a
-- record that passes its deadline is dropped: its tokens are spent, and
-- the bucket refills from there. A holder must not use its tokens after
-- the deadline (it counts its own, shorter, from before it sent the call),
-- and gives them back only while its record covers them: a refund beyond
-- the record is dropped.
--
-- KEYS[1]  key base "<prefix>:{<tag>}:"
-- ARGV[1]  "tb" or "gcra"
-- ARGV[2]  the state's kind (script.Kind): the key is KEYS[1] .. kind
-- ARGV[3..5]  tb: R, P (microseconds), C = B * P (one token is P units, the
--          refill R units per microsecond); gcra: T = floor(P / R),
--          tau = B * T, unused
-- ARGV[6]  now in microseconds, or -1 to read TIME
-- ARGV[7]  the call's nonce ("" keeps no record; gcra keeps none: its
--          state is global's string)
-- ARGV[8]  1 when the call is sent again after its reply was lost
-- ARGV[9]  instances sharing the bucket (caps a grant at a share of it)
-- ARGV[10] want: tokens wanted (0: none)   ARGV[11] min: the least worth having
-- ARGV[12] refund: unused tokens to give back (never above the capacity)
-- ARGV[13] use: tokens admitted without a grant, to take now even below empty
-- ARGV[14] holder: the caller's name in the records ("": it holds nothing
--          and its record, if any, is left as it is)
-- ARGV[15] keep: tokens the holder keeps (the rest of its record was
--          spent, or goes back as the refund); its record is then keep
--          plus the grant
-- ARGV[16] hold: microseconds the holder's record lasts from now
-- ARGV[17] back: tokens decisions gave back (they used less than they
--          took: a reservation settled smaller, say), whoever holds them:
--          they go back to the bucket as far as it has room
--
-- Returns {grant, level, retry, full, flag, kept}: the tokens granted; the
-- whole tokens the bucket holds after the call (negative in an overdraft);
-- when grant < min, the microseconds until min tokens are in it; the
-- microseconds until it is full; flag as the window lease script's (0
-- applied, 1 replayed, 2 resent and unknown: only the use applied); the
-- tokens of keep the holder's record covers (-1: no record was written).
local base, algo, kind = KEYS[1], ARGV[1], ARGV[2]
local a3, a4, a5 = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local now = clock(ARGV[6])
local nonce, resent = ARGV[7], ARGV[8] == '1'
local n = tonumber(ARGV[9])
if n < 1 then n = 1 end
local want, minimum = tonumber(ARGV[10]), tonumber(ARGV[11])
if minimum < 1 then minimum = 1 end
local refund, use = tonumber(ARGV[12] or '0') or 0, tonumber(ARGV[13] or '0') or 0
local holder, keep = ARGV[14] or '', tonumber(ARGV[15] or '0') or 0
local hold = tonumber(ARGV[16] or '0') or 0
local back = tonumber(ARGV[17] or '0') or 0
local key = base .. kind
local hf, ef = 'h' .. holder, 'e' .. holder
-- the hash of the records: a TokenBucket's own state, a GCRA's beside it;
-- agg[ai..ai+2] its s, d and x, then (with a holder) the holder's record
local hkey, agg, ai = key, nil, 3

-- The bucket as units u of capacity C, P units a token, refilled R units
-- a microsecond: tb as stored; gcra with u = tau - d, P = T, R = 1.
local C, P, R, u, ts, rrec, st
if algo == 'tb' then
  R, P, C = a3, a4, a5
  if holder ~= '' then
    st = redis.call('HMGET', key, 'u', 'ts', 's', 'd', 'x', hf, ef)
  else
    st = redis.call('HMGET', key, 'u', 'ts', 's', 'd', 'x')
  end
  u, ts = tonumber(st[1] or ''), tonumber(st[2] or '')
  agg = st
  if u == nil or ts == nil then u, ts = C, now end
  if resent and nonce ~= '' then rrec = redis.call('HGET', key, 'r') end
  if rrec then
    if string.sub(rrec, 1, #nonce) == nonce then
      local g = tonumber(string.sub(rrec, #nonce + 1))
      if g then return {g, fdiv(u, P), 0, 0, 1, -1} end
    end
  end
else
  R, P, C = 1, a3, a4
  u = C - tat_delay(redis.call('GET', key), now)
  hkey = key .. ':held'
  if holder ~= '' then
    agg = redis.call('HMGET', hkey, 's', 'd', 'x', hf, ef)
  else
    agg = redis.call('HMGET', hkey, 's', 'd', 'x')
  end
  ai = 1
end
-- pure(s): the units at time s <= now by the refill alone
local function pure(s)
  if algo == 'tb' then
    if s <= ts then return u end
    local v = u + (s - ts) * R
    if v > C then v = C end
    return v
  end
  local d = (C - u) + (now - s) -- tat - s
  if d < 0 then d = 0 end
  return C - d
end

-- The records: fields "h" .. holder (its tokens) and "e" .. holder (its
-- deadline) in their hash, with three of their own: s the tokens the
-- records hold, d a time no record ends before, x the latest deadline.
-- Only once a record may have ended (d) are they all read: those past
-- their deadline go, and s, d and x are counted again.
local held, hmin, hmax = tonumber(agg[ai] or '') or 0, tonumber(agg[ai + 1] or ''), tonumber(agg[ai + 2] or '') or 0
local rebuilt = false
local gone, gsum = nil, 0
if hmin ~= nil and hmin <= now then
  local recs = redis.call('HGETALL', hkey)
  local tok, dls, names = {}, {}, {}
  for i = 1, #recs, 2 do
    local c = string.sub(recs[i], 1, 1)
    if c == 'h' then
      tok[string.sub(recs[i], 2)] = tonumber(recs[i + 1]) or 0
    elseif c == 'e' then
      dls[string.sub(recs[i], 2)] = tonumber(recs[i + 1]) or 0
    end
  end
  held, hmin, hmax, rebuilt, gone = 0, nil, 0, true, {}
  for name, t in pairs(tok) do
    local dl = dls[name] or 0
    if dl <= now then
      gone[#gone + 1] = {t, dl}
      gsum = gsum + t
      names[#names + 1] = 'h' .. name
      names[#names + 1] = 'e' .. name
    else
      held = held + t
      if hmin == nil or dl < hmin then hmin = dl end
      if dl > hmax then hmax = dl end
    end
  end
  if #names > 0 then redis.call('HDEL', hkey, unpack(names)) end
end
local own = 0
if holder ~= '' then
  local t, dl = tonumber(agg[ai + 3] or ''), tonumber(agg[ai + 4] or '')
  if t and dl and dl > now then own = t end
end
-- The refill under the cap, from the records as they were: each gone
-- record lifted the cap at its deadline, from where the bucket was then.
local capped = false
if gone and #gone > 0 then
  if #gone > 1 then table.sort(gone, function(x, y) return x[2] < y[2] end) end
  local h, v, s = held + gsum, nil, nil
  for _, g in ipairs(gone) do
    if v == nil then v = pure(g[2]) else v = v + (g[2] - s) * R end
    if v > C - h * P then v = C - h * P end
    if v > C then v = C end
    s, h = g[2], h - g[1]
  end
  if v == nil then v = pure(now) else v = v + (now - s) * R end
  if v > C then v = C end
  if v > C - held * P then v = C - held * P end
  u, capped = v, true
else
  u = pure(now)
  if held > 0 then
    if u > C - held * P then u = C - held * P end
    capped = true
  end
end
if algo == 'tb' and now > ts then ts = now end

-- What the holder keeps and gives back, as far as its record covers them.
local kept = -1
if holder ~= '' and not resent then
  kept = keep
  if kept > own then kept = own end
  if kept < 0 then kept = 0 end
  if refund > own - kept then refund = own - kept end
end
if not resent and refund + back > 0 then
  u = u + (refund + back) * P
  if u > C then u = C end
end

if use > 0 then u = u - use * P end
local grant, retry = 0, 0
if not resent and want > 0 then
  local have = fdiv(u, P)
  if have >= minimum then
    -- at most this caller's share of what the bucket holds, but never a
    -- cascade of tiny grants: at least a quarter of the capacity shared
    -- by the instances
    local cap = fdiv(have, n)
    local tail = cdiv(fdiv(C, P), 4 * n)
    if cap < tail then cap = tail end
    grant = want
    if grant > cap then grant = cap end
    if grant > have then grant = have end
    if grant < minimum then grant = minimum end
    u = u - grant * P
  else
    retry = cdiv(minimum * P - u, R)
    if retry < 1 then retry = 1 end
  end
end

-- The holder's record: what it keeps and what of the grant it holds. (d
-- stays at or before every deadline: a record pushed on or gone leaves
-- it early, and the records are read again then. The hash lives at least
-- until x, set a hold past the latest deadline: one PEXPIRE a hold.)
local rf, rdel, clear, xset = nil, nil, false, nil
local held0 = held -- (as stored in s, unless rebuilt)
if kept >= 0 then
  local mine = kept + grant
  held = held - own + mine
  if mine > 0 then
    local dl = now + hold
    rf = {ef, dl}
    if mine ~= own then rf[3], rf[4] = hf, mine end -- (own: its live record)
    if held ~= held0 or rebuilt then rf[#rf + 1] = 's'; rf[#rf + 1] = held end
    if hmin == nil or dl < hmin or rebuilt then
      if hmin == nil or dl < hmin then hmin = dl end
      rf[#rf + 1] = 'd'; rf[#rf + 1] = hmin
    end
    if dl > hmax then hmax, xset = dl + hold, dl + hold end
    if xset or rebuilt then rf[#rf + 1] = 'x'; rf[#rf + 1] = hmax end
    rebuilt = false
  elseif own > 0 then
    rdel = true
    if held > 0 then rf = {'s', held} end
    rebuilt = rebuilt or held <= 0
  end
  capped = true
end
if rebuilt then
  if held <= 0 then clear = true else rf = {'s', held, 'd', hmin, 'x', hmax} end
end
if rdel then redis.call('HDEL', hkey, hf, ef) end
if algo ~= 'tb' then
  if clear then
    redis.call('DEL', hkey) -- no record holds a token (none holds 0)
  elseif rf then
    redis.call('HSET', hkey, unpack(rf))
  end
  if xset and held > 0 then redis.call('PEXPIRE', hkey, expiry_ms(xset - now)) end
elseif clear then
  redis.call('HDEL', key, 's', 'd', 'x')
end
if held > 0 and u > C - held * P then u = C - held * P end

if capped or use > 0 or grant > 0 or (refund + back > 0 and not resent) then
  if algo == 'tb' then
    local rec = nil
    if nonce ~= '' and not resent then rec = nonce .. grant end
    if rf then
      local f = {'u', u, 'ts', ts}
      if rec then f[5], f[6] = 'r', rec end
      for i = 1, #rf do f[#f + 1] = rf[i] end
      redis.call('HSET', key, unpack(f))
    elseif rec then
      redis.call('HSET', key, 'u', u, 'ts', ts, 'r', rec)
    else
      redis.call('HSET', key, 'u', u, 'ts', ts)
    end
    local left = C - u
    if left < 1 then left = 1 end
    left = cdiv(left, R)
    if held > 0 and hmax - now > left then
      -- the records live as long: the key has lived until x since x was
      -- set (held0 > 0), so only a new x needs a PEXPIRE
      if held0 <= 0 or xset then redis.call('PEXPIRE', key, expiry_ms(hmax - now)) end
    else
      redis.call('PEXPIRE', key, expiry_ms(left))
    end
  else
    local d = C - u
    if d > 0 then
      redis.call('SET', key, tat_string(now, d), 'PX', expiry_ms(d))
    else
      redis.call('DEL', key) -- full: the same as no state
    end
  end
end
local full = cdiv(C - u, R)
if full < 0 then full = 0 end
local flag = 0
if resent then flag = 2 end
return {grant, fdiv(u, P), retry, full, flag, kept}
