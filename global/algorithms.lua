-- The five algorithms of docs/algorithms.md, in integer microseconds, for
-- every script of package global: prepended to each (after the prelude)
-- when it is built, so each algorithm is written once.
--
-- A limit L holds what its algorithm needs: key (KEYS[1] .. suffix, for
-- SlidingLog, TokenBucket and GCRA) or kind (the window counters' suffix,
-- wkey(base, kind, i)), R, P (microseconds), and C = B * P (TokenBucket) or
-- T = floor(P/R) and tau = B * T (GCRA).
--
-- Each algorithm reads its state and decides n events at now, writing
-- nothing: it returns fits, remaining (possibly below 0 after an overdraft:
-- the caller clamps it), retry and reset in microseconds, and commit, a
-- function that consumes the n events (to be called only when they fit,
-- once) and returns remaining and reset after that. A multi-limit script
-- asks every limit before it commits any.

local function fixed_window(base, L, now, n)
  local P, R = L.P, L.R
  local idx = fdiv(now, P)
  local e = now - idx * P -- elapsed in the window; ws + P - now = P - e
  local key = wkey(base, L.kind, idx)
  local count = wcount(key)
  local fits = count + n <= R
  local retry = 0
  if not fits then retry = P - e end
  return fits, R - count, retry, P - e, function()
    count = wincr(key, n)
    redis.call('PEXPIRE', key, expiry_ms(P - e))
    return R - count, P - e
  end
end

-- The counters of the current window, the previous one and the next, which
-- only a hybrid limiter's lease ahead of the window's start fills.
local function sliding_window(base, L, now, n)
  local P, R = L.P, L.R
  local idx = fdiv(now, P)
  local e = now - idx * P
  local ckey = wkey(base, L.kind, idx)
  local curr = wcount(ckey)
  local prev = wcount(wkey(base, L.kind, idx - 1))
  local nxt = wcount(wkey(base, L.kind, idx + 1))
  -- The estimate now, and what the next window will start from (the
  -- current window weighted fully, plus what was leased from the next one
  -- already): an admission must keep both within R.
  local est
  if prev * (P - e) >= 9007199254740992 then
    -- An overdraft's count weighs at least 2^53: far above R, whose
    -- product with P is at most 2^53. Saturate, as package local does
    -- (the double product would round).
    est = 9007199254740992
  else
    est = fdiv(prev * (P - e), P) + curr
  end
  local bound = est
  if curr + nxt > bound then bound = curr + nxt end
  local fits = bound + n <= R
  local retry = 0
  if not fits then
    if curr + nxt + n <= R then -- the estimate binds: wait for prev to decay
      retry = first(prev, R - curr - n, P) - e
    else
      retry = (P - e) + first(curr, R - nxt - n, P) -- the next window
    end
  end
  return fits, R - bound, retry, P - e, function()
    wincr(ckey, n)
    redis.call('PEXPIRE', ckey, expiry_ms(2 * P - e))
    return R - bound - n, P - e
  end
end

-- window_over adds over events to the counter of the current window of a
-- window limit L (its kind and P) past the limit, saturating at 2^53, and
-- keeps the counter span microseconds from its window's start: P, or 2P
-- for a SlidingWindow, whose count weighs into the next window.
local function window_over(base, L, now, over, span)
  local idx = fdiv(now, L.P)
  local key = wkey(base, L.kind, idx)
  local c = wcount(key)
  if c + over >= 9007199254740992 then over = 9007199254740992 - c end
  if over > 0 then
    wincr(key, over)
    redis.call('PEXPIRE', key, expiry_ms(idx * L.P + span - now))
  end
end

-- charge_window charges use events that an instance admitted without
-- Redis in window idx0 to that window, when it is still the current one,
-- and reports whether it did: a debt of a window that has ended is
-- dropped by the caller, and one whose reply is lost is sent again (then
-- counted twice at worst, the safe side).
local function charge_window(base, L, now, idx0, use, span)
  if use <= 0 or idx0 ~= fdiv(now, L.P) then return false end
  window_over(base, L, now, use, span)
  return true
end

-- The log is the sorted set L.key (score: admission time; member: a unique
-- number from the counter L.key .. ':seq'). Stale entries are dropped only
-- by an admission. Instants t + P can exceed 2^53 for a long Period, so
-- they are computed as P - (now - t).
local function sliding_log(L, now, n)
  local P, R = L.P, L.R
  local log, seqkey = L.key, L.key .. ':seq'
  local cutoff = now - P -- entries with t <= cutoff are out of the window
  local count = redis.call('ZCOUNT', log, cutoff + 1, '+inf')
  local fits = count + n <= R
  local reset = 0
  if count > 0 then
    local newest = redis.call('ZRANGE', log, -1, -1, 'WITHSCORES')
    reset = P - (now - tonumber(newest[2]))
  end
  local retry = 0
  if not fits then
    local k = count + n - R -- 1-based rank among the live entries
    local tk = redis.call('ZRANGEBYSCORE', log, cutoff + 1, '+inf', 'WITHSCORES', 'LIMIT', k - 1, 1)
    retry = P - (now - tonumber(tk[2]))
  end
  return fits, R - count, retry, reset, function()
    redis.call('ZREMRANGEBYSCORE', log, '-inf', cutoff)
    local last = redis.call('INCRBY', seqkey, n)
    local m = last - n + 1
    while m <= last do
      local args = {}
      local stop = m + 499
      if stop > last then stop = last end
      for i = m, stop do
        args[#args + 1] = now
        args[#args + 1] = string.format('%d', i)
      end
      redis.call('ZADD', log, unpack(args))
      m = stop + 1
    end
    local ttl = expiry_ms(P)
    redis.call('PEXPIRE', log, ttl)
    redis.call('PEXPIRE', seqkey, ttl)
    return R - count - n, P -- the newest entry is now
  end
end

-- bucket returns a TokenBucket's content u (one token = P units, so the
-- refill is exactly R units per microsecond) refilled to now, and its ts,
-- from the hash L.key (fields u, ts): u = min(C, u + max(0, now - ts) * R),
-- the product capped (a double product that is not exact is far above
-- C - u, so the comparison still decides right). An absent key is a full
-- bucket. A settled overdraft can leave u below 0.
local function bucket(L, now)
  local st = redis.call('HMGET', L.key, 'u', 'ts')
  local u, ts = tonumber(st[1] or ''), tonumber(st[2] or '')
  if u == nil or ts == nil then return L.C, now end
  local add = 0
  if now > ts then add = (now - ts) * L.R end
  if add >= L.C - u then u = L.C else u = u + add end
  if now > ts then ts = now end
  return u, ts
end

local function put_bucket(L, u, ts)
  redis.call('HSET', L.key, 'u', u, 'ts', ts)
  redis.call('PEXPIRE', L.key, expiry_ms(cdiv(L.C - u, L.R)))
end

local function token_bucket(L, now, n)
  local P, R, C = L.P, L.R, L.C
  local u, ts = bucket(L, now)
  local need = n * P
  local fits = u >= need
  local retry = 0
  if not fits then retry = cdiv(need - u, R) end
  return fits, fdiv(u, P), retry, cdiv(C - u, R), function()
    u = u - need
    put_bucket(L, u, ts)
    return fdiv(u, P), cdiv(C - u, R)
  end
end

-- GCRA's tat can pass 2^53 microseconds, so it is never formed as a
-- double: the prelude's tat_delay and tat_string read and write it as its
-- decimal digits, and the scripts work with d = max(tat, now) - now (an
-- absent key has tat = now). ntat - now is d + n*T; ntat - tau - now is
-- n*T - (tau - d).
local function gcra_d(L, now)
  return tat_delay(redis.call('GET', L.key), now)
end

local function put_gcra(L, now, d)
  redis.call('SET', L.key, tat_string(now, d), 'PX', expiry_ms(d))
end

local function gcra(L, now, n)
  local T, tau = L.T, L.tau
  local d = gcra_d(L, now)
  local nT = n * T
  local fits = d + nT <= tau -- ntat - now <= tau
  local retry = 0
  if not fits then retry = nT - (tau - d) end
  return fits, fdiv(tau - d, T), retry, d, function()
    d = d + nT
    put_gcra(L, now, d)
    return fdiv(tau - d, T), d
  end
end

-- single is a single-limit script's decision and reply: {allowed (0/1),
-- remaining (clamped at 0), retry_after_us, reset_after_us}.
local function single(fits, remaining, retry, reset, commit)
  if fits then remaining, reset = commit() end
  if remaining < 0 then remaining = 0 end
  return {fits and 1 or 0, remaining, retry, reset}
end
