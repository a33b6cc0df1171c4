-- leaky_bucket (the seeds' funnel, policing form): level L leaks one unit per I µs,
-- remainder carried; leak first, then admit iff L + cost <= C, in this one script (the
-- seeds' separate "make space" and "watering" calls race). A missing key is empty.
-- State: hash {l = level, t = µs at which l was valid}. Twin of src/algo/leaky_bucket.rs.
ALGO.leaky_bucket = function(key, p, now, cost, commit)
  local c, i = p.capacity, p.interval
  local s = redis.call('HMGET', key, 'l', 't')
  local sl, st = int(s[1]), int(s[2])
  local l, t = 0, now
  -- A t after now (corruption, clock stepped back) reads as fresh, i.e. empty.
  if sl ~= nil and st ~= nil and st <= now then
    l = math.min(sl, c)
    local leaked = idiv(now - st, i)
    if leaked >= l then
      l, t = 0, now
    else
      l, t = l - leaked, st + leaked * i
    end
  end
  -- Time until `units` more have leaked: the first one leaks at t + I.
  local function after(units) return units * i - (now - t) end
  if cost > c then return 2, c, c - l, 0, after(l) end
  if cost == 0 then return 0, c, c - l, 0, after(l) end
  if l + cost > c then return 1, c, c - l, after(l + cost - c), after(l) end
  local level = l + cost
  if commit then
    redis.call('HSET', key, 'l', fmt(level), 't', fmt(t))
    expire_us(key, after(level))
  end
  return 0, c, c - level, 0, after(level)
end
