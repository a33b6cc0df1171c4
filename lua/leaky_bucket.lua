-- leaky_bucket (the seeds' funnel, policing form): level L leaks one unit per I µs,
-- remainder carried; leak first, then admit iff L + cost <= C, in this one script (the
-- seeds' separate "make space" and "watering" calls race). A missing key is empty.
-- State: hash {l = level, t = µs at which l was valid}. Twin of src/algo/leaky_bucket.rs.
-- A charge after the answer may fill it past C, up to 2C: debt later requests wait out.

-- The level at now: (level, t) with t <= now.
local function leak(key, p, now)
  local c, i = p.capacity, p.interval
  local s = redis.call('HMGET', key, 'l', 't')
  local sl, st = int(s[1]), int(s[2])
  local l, t = 0, now
  -- A t after now (corruption, clock stepped back) reads as fresh, i.e. empty.
  if sl ~= nil and st ~= nil and st <= now then
    l = min(sl, 2 * c)
    local leaked = idiv(now - st, i)
    if leaked >= l then
      l, t = 0, now
    else
      l, t = l - leaked, st + leaked * i
    end
  end
  return l, t
end

-- Time until `units` more have leaked at `now`: the first one leaks at t + I. A function of
-- the file, not a closure per decision (Redis would allocate one each time).
local function leaked_after(t, units, i, now) return units * i - (now - t) end

ALGO.leaky_bucket = function(key, p, now, cost, commit)
  local c, i = p.capacity, p.interval
  local l, t = leak(key, p, now)
  local left = max(c - l, 0)
  local drained = leaked_after(t, l, i, now)
  if cost > c then return 2, c, left, 0, drained end
  if cost == 0 then return 0, c, left, 0, drained end
  if l + cost > c then return 1, c, left, leaked_after(t, l + cost - c, i, now), drained end
  local level = l + cost
  local reset = leaked_after(t, level, i, now)
  if commit then
    redis.call('HSET', key, 'l', fmt(level), 't', fmt(t))
    expire_us(key, reset)
  end
  return 0, c, c - level, 0, reset
end

-- Charge whatever room is left (after the answer): up to 2C, then 2C as of now.
CHARGE.leaky_bucket = function(key, p, now, cost)
  local c, i = p.capacity, p.interval
  local l, t = leak(key, p, now)
  if l + cost <= c then return ALGO.leaky_bucket(key, p, now, cost, true) end
  local level = l + cost
  if t + level * i > now + 2 * c * i then level, t = 2 * c, now end
  redis.call('HSET', key, 'l', fmt(level), 't', fmt(t))
  local reset = t + level * i - now
  expire_us(key, reset)
  return 0, c, 0, 0, reset
end
