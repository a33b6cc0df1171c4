-- fixed_window: window k = floor(now / W), epoch-aligned; admit iff count + cost <= N.
-- fixed_month: the same over UTC calendar months (`N/month`): k = year * 12 + month - 1.
-- State: hash {w = window index, n = count}. Twin of src/limiter/algo/fixed_window.rs, and
-- the month arithmetic of src/limiter/algo/calendar.rs.
local DAY_US = 86400000000

-- (year, month 1..12) of a day count since 1970-01-01 (Hinnant's civil_from_days).
local function civil_from_days(days)
  local z = days + 719468
  local era = idiv(z, 146097)
  local doe = z - era * 146097
  local yoe = idiv(doe - idiv(doe, 1460) + idiv(doe, 36524) - idiv(doe, 146096), 365)
  local doy = doe - (365 * yoe + idiv(yoe, 4) - idiv(yoe, 100))
  local mp = idiv(5 * doy + 2, 153)
  local m = mp < 10 and mp + 3 or mp - 9
  local y = yoe + era * 400
  if m <= 2 then y = y + 1 end
  return y, m
end

-- Days since 1970-01-01 of the first day of month m of year y (Hinnant's days_from_civil).
local function days_from_civil(y, m)
  if m <= 2 then y = y - 1 end
  local era = idiv(y, 400)
  local yoe = y - era * 400
  local mp = m > 2 and m - 3 or m + 9
  local doe = yoe * 365 + idiv(yoe, 4) - idiv(yoe, 100) + idiv(153 * mp + 2, 5)
  return era * 146097 + doe - 719468
end

local function fixed(key, p, now, cost, commit, k, to_end)
  local n = p.limit
  local s = redis.call('HMGET', key, 'w', 'n')
  local sw, sc = int(s[1]), int(s[2])
  local count = 0
  -- Any other window (older, or future after a clock step back) counts nothing.
  if sw ~= nil and sc ~= nil and sw == k then count = sc end
  local remaining = max(n - count, 0)
  local reset = 0
  if count > 0 then reset = to_end end
  if cost > n then return 2, n, remaining, 0, reset end
  if cost == 0 then return 0, n, remaining, 0, reset end
  -- The next window starts empty and cost <= N, so it passes exactly then.
  if cost > remaining then return 1, n, remaining, to_end, reset end
  if commit then
    redis.call('HSET', key, 'w', fmt(k), 'n', fmt(count + cost))
    expire_us(key, to_end)
  end
  return 0, n, remaining - cost, 0, to_end
end

ALGO.fixed_window = function(key, p, now, cost, commit)
  local k = idiv(now, p.window)
  return fixed(key, p, now, cost, commit, k, (k + 1) * p.window - now)
end

ALGO.fixed_month = function(key, p, now, cost, commit)
  local y, m = civil_from_days(idiv(now, DAY_US))
  local ny, nm = y, m + 1
  if m == 12 then ny, nm = y + 1, 1 end
  local stop = days_from_civil(ny, nm) * DAY_US
  return fixed(key, p, now, cost, commit, y * 12 + m - 1, stop - now)
end
