-- gcra: one theoretical arrival time (string key, µs). With debt = max(tat − now, 0),
-- admit iff debt + cost·I <= C·I; then TAT = now + debt + cost·I, which is also its TTL.
-- Same decisions as token_bucket with the same C and I. Twin of src/algo/gcra.rs.
-- A charge after the answer may push the TAT up to 2·C·I ahead (debt waited out).

local function gcra_debt(key, p, now)
  local tat = int(redis.call('GET', key))
  -- A TAT more than 2·C·I ahead cannot come from these rules: it reads as fresh.
  if tat ~= nil and tat > now and tat - now <= 2 * p.capacity * p.interval then
    return tat - now
  end
  return 0
end

ALGO.gcra = function(key, p, now, cost, commit)
  local c, i = p.capacity, p.interval
  local full = c * i
  local debt = gcra_debt(key, p, now)
  local remaining = idiv(max(full - debt, 0), i)
  if cost > c then return 2, c, remaining, 0, debt end
  if cost == 0 then return 0, c, remaining, 0, debt end
  local debt2 = debt + cost * i
  if debt2 > full then return 1, c, remaining, debt2 - full, debt end
  if commit then
    redis.call('SET', key, fmt(now + debt2), 'PX', fmt(idiv(debt2 + 999, 1000)))
  end
  return 0, c, idiv(full - debt2, i), 0, debt2
end

-- Charge whatever is left (after the answer): the TAT goes at most 2·C·I ahead.
CHARGE.gcra = function(key, p, now, cost)
  local c, i = p.capacity, p.interval
  local debt2 = min(gcra_debt(key, p, now) + cost * i, 2 * c * i)
  redis.call('SET', key, fmt(now + debt2), 'PX', fmt(idiv(debt2 + 999, 1000)))
  return 0, c, idiv(max(c * i - debt2, 0), i), 0, debt2
end
