-- gcra: one theoretical arrival time (string key, µs). With debt = max(tat − now, 0),
-- admit iff debt + cost·I <= C·I; then TAT = now + debt + cost·I, which is also its TTL.
-- Same decisions as token_bucket with the same C and I. Twin of src/algo/gcra.rs.
ALGO.gcra = function(key, p, now, cost, commit)
  local c, i = p.capacity, p.interval
  local full = c * i
  local tat = int(redis.call('GET', key))
  local debt = 0
  -- A TAT more than C·I ahead cannot come from this rule: it reads as fresh.
  if tat ~= nil and tat > now and tat - now <= full then debt = tat - now end
  local remaining = idiv(full - debt, i)
  if cost > c then return 2, c, remaining, 0, debt end
  if cost == 0 then return 0, c, remaining, 0, debt end
  local debt2 = debt + cost * i
  if debt2 > full then return 1, c, remaining, debt2 - full, debt end
  if commit then
    redis.call('SET', key, fmt(now + debt2), 'PX', fmt(idiv(debt2 + 999, 1000)))
  end
  return 0, c, idiv(full - debt2, i), 0, debt2
end
