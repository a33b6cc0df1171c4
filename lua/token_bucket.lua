-- token_bucket: capacity C, one token per I µs, remainder carried (t only moves by whole I
-- while not full); admit iff tokens >= cost. A missing key is a full bucket.
-- State: hash {n = tokens, t = µs at which n was valid}. Twin of src/algo/token_bucket.rs.
-- A charge after the answer may leave debt: n = 0 until a t at most C·I ahead, with the
-- interval it was written at (i), so that a new rate keeps the tokens owed, not the time.
-- Only a debt needs i: t <= now is read at the current interval, as elapsed time.

-- The bucket at now: (tokens, t), t <= now, or (0, t) in debt with now < t <= now + C·I;
-- and whether the state must be written again to say so.
local function token_refill(key, p, now)
  local c, i = p.capacity, p.interval
  local s = redis.call('HMGET', key, 'n', 't')
  local sn, st = int(s[1]), int(s[2])
  local n, t = c, now
  -- A debt keeps its tokens owed at a new interval (i, read only then: a debt is rare), and
  -- one further ahead than C·I (a lowered burst, a clock step) is held to C·I; either is
  -- restated. Any other t after now (corruption, clock stepped back) reads as fresh, i.e. full.
  if sn == 0 and st ~= nil and st > now then
    local bound, debt = c * i, st - now
    local was = int(redis.call('HGET', key, 'i'))
    local rescaled = was ~= nil and was > 0 and was ~= i
    if rescaled then debt = rescale(debt, was, i, bound) end
    if debt <= bound then return 0, now + debt, rescaled end
    return 0, now + bound, true
  elseif sn ~= nil and st ~= nil and st <= now then
    n = min(sn, c)
    local add = idiv(now - st, i) -- divide first: no overflow after a long idle
    if add >= c - n then
      n, t = c, now
    else
      n, t = n + add, st + add * i
    end
  end
  return n, t, false
end

-- A debt: no tokens until t, written with its interval.
local function token_owe(key, t, i, ttl)
  redis.call('HSET', key, 'n', '0', 't', fmt(t), 'i', fmt(i))
  expire_us(key, ttl)
end

-- Time until `need` more tokens have arrived at `now`: the first one arrives at t + I.
local function token_after(t, need, i, now) return max(t + need * i - now, 0) end

ALGO.token_bucket = function(key, p, now, cost, commit)
  local c, i = p.capacity, p.interval
  local n, t, restate = token_refill(key, p, now)
  if cost > c then return 2, c, n, 0, token_after(t, c - n, i, now) end
  -- A debt read at another interval or held to its bound is written as read (nothing charged).
  if restate and commit then token_owe(key, t, i, token_after(t, c, i, now)) end
  if cost == 0 then return 0, c, n, 0, token_after(t, c - n, i, now) end
  if cost > n then return 1, c, n, token_after(t, cost - n, i, now), token_after(t, c - n, i, now) end
  local left = n - cost
  local reset = token_after(t, c - left, i, now)
  if commit then
    redis.call('HSET', key, 'n', fmt(left), 't', fmt(t))
    expire_us(key, reset)
  end
  return 0, c, left, 0, reset
end

-- Charge whatever is left (after the answer): what does not fit is owed, at most C·I ahead.
CHARGE.token_bucket = function(key, p, now, cost)
  local c, i = p.capacity, p.interval
  local n, t = token_refill(key, p, now)
  if cost <= n then return ALGO.token_bucket(key, p, now, cost, true) end
  t = min(t + (cost - n) * i, now + c * i)
  local reset = t + c * i - now
  token_owe(key, t, i, reset)
  return 0, c, 0, 0, reset
end
