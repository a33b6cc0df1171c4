-- gcra: one theoretical arrival time (string key, µs). With debt = max(tat − now, 0),
-- admit iff debt + cost·I <= C·I; then TAT = now + debt + cost·I, which is also its TTL.
-- Same decisions as token_bucket with the same C and I. Twin of src/algo/gcra.rs.
-- A charge after the answer may push the TAT up to 2·C·I ahead (debt waited out).
--
-- The TAT is time owed; the interval it was written with is kept beside it (in the same
-- Cluster slot), so that a new rate keeps the units owed rather than the time. A state
-- without it (written by an older version) reads at the current one.

-- Where KEY's interval is kept: KEY:i, in KEY's Cluster slot because KEY has a hash tag
-- (every key Sluice makes ends in `{hash}`). A key without one keeps no interval.
local function gcra_interval_key(key)
  local open = string.find(key, '{', 1, true)
  local close = open and string.find(key, '}', open + 1, true)
  if close and close > open + 1 then return key .. ':i' end
  return nil
end

-- The debt at now in µs at the current interval, and whether the state must be written again
-- to say so (read at another interval, or held to the 2·C·I bound). GET, not MGET: a key of
-- another type is an error (nothing written), not a fresh bucket written over it.
local function gcra_debt(key, ikey, p, now)
  local tat = int(redis.call('GET', key))
  if tat == nil or tat <= now then return 0, false end
  local was = ikey and int(redis.call('GET', ikey))
  local c, i = p.capacity, p.interval
  local bound = 2 * c * i
  local kept = was ~= nil and was > 0
  local debt = tat - now
  local rescaled = kept and was ~= i
  if rescaled then debt = rescale(debt, was, i, bound) end
  if debt > bound then
    -- Only a lowered burst (or a clock step) on a state written here: held to the bound.
    -- Without a kept interval (corruption, an older version's clock step): fresh.
    if kept then return bound, true end
    return 0, false
  end
  return debt, rescaled
end

-- The interval first: should its write fail (a Cluster slot mid-migration), nothing of the
-- request is charged yet.
local function gcra_write(key, ikey, now, debt, i)
  local px = fmt(idiv(debt + 999, 1000))
  if ikey then redis.call('SET', ikey, fmt(i), 'PX', px) end
  redis.call('SET', key, fmt(now + debt), 'PX', px)
end

ALGO.gcra = function(key, p, now, cost, commit)
  local c, i = p.capacity, p.interval
  local full = c * i
  local ikey = gcra_interval_key(key)
  local debt, restate = gcra_debt(key, ikey, p, now)
  local remaining = idiv(max(full - debt, 0), i)
  if cost > c then return 2, c, remaining, 0, debt end
  -- A state read at another interval is written as read (nothing charged), so that the
  -- wait and reset stated are what the next reading finds.
  if restate and commit then gcra_write(key, ikey, now, debt, i) end
  if cost == 0 then return 0, c, remaining, 0, debt end
  local debt2 = debt + cost * i
  if debt2 > full then return 1, c, remaining, debt2 - full, debt end
  if commit then gcra_write(key, ikey, now, debt2, i) end
  return 0, c, idiv(full - debt2, i), 0, debt2
end

-- Charge whatever is left (after the answer): the TAT goes at most 2·C·I ahead.
CHARGE.gcra = function(key, p, now, cost)
  local c, i = p.capacity, p.interval
  local ikey = gcra_interval_key(key)
  local debt2 = min(gcra_debt(key, ikey, p, now) + cost * i, 2 * c * i)
  gcra_write(key, ikey, now, debt2, i)
  return 0, c, idiv(max(c * i - debt2, 0), i), 0, debt2
end
