-- fixed_window: window k = floor(now / W), epoch-aligned; admit iff count + cost <= N
-- (count: this window's, plus the debt a charge after the answer carried from the last).
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

-- The count at window k: its own, or what a charge put past N in window k - 1 (debt carried
-- into this one, so the long-run rate holds). Any other window (older, or future after a
-- clock step back) counts nothing.
local function count_at(key, n, k)
  local s = redis.call('HMGET', key, 'w', 'n')
  local sw, sc = int(s[1]), int(s[2])
  if sw == nil or sc == nil then return 0 end
  if sw == k then return sc end
  if sw == k - 1 and sc > n then return sc - n end
  return 0
end

-- Until a window holding `count` (at most 2N) has carried it all off: its end, or the next
-- window's when it carries debt into that one.
local function until_clear(n, count, to_end, next_len)
  if count == 0 then return 0 end
  if count <= n then return to_end end
  return to_end + next_len
end

-- Decide `cost` on a window holding `count` (see count_at).
local function fixed(key, p, cost, commit, k, to_end, next_len, count)
  local n = p.limit
  local remaining = max(n - count, 0)
  local reset = until_clear(n, count, to_end, next_len)
  if cost > n then return 2, n, remaining, 0, reset end
  if cost == 0 then return 0, n, remaining, 0, reset end
  if cost > remaining then
    -- The next window starts with what this one carries (at most N), the one after empty.
    local retry = to_end
    if max(count - n, 0) + cost > n then retry = to_end + next_len end
    return 1, n, remaining, retry, reset
  end
  if commit then
    redis.call('HSET', key, 'w', fmt(k), 'n', fmt(count + cost))
    expire_us(key, to_end)
  end
  return 0, n, remaining - cost, 0, to_end
end

-- Charge even past N (after the answer): up to 2N, the excess carried into the next window.
local function fixed_charge(key, p, cost, k, to_end, next_len)
  local n = p.limit
  local count = count_at(key, n, k)
  if count + cost <= n then return fixed(key, p, cost, true, k, to_end, next_len, count) end
  count = min(count + cost, 2 * n)
  redis.call('HSET', key, 'w', fmt(k), 'n', fmt(count))
  local reset = until_clear(n, count, to_end, next_len)
  expire_us(key, reset)
  return 0, n, 0, 0, reset
end

-- Window index, µs to its end and the next window's length, for each kind of window.
local function epoch_window(p, now)
  local k = idiv(now, p.window)
  return k, (k + 1) * p.window - now, p.window
end

local function month_window(now)
  local y, m = civil_from_days(idiv(now, DAY_US))
  local ny, nm = y, m + 1
  if m == 12 then ny, nm = y + 1, 1 end
  local nny, nnm = ny, nm + 1
  if nm == 12 then nny, nnm = ny + 1, 1 end
  local stop = days_from_civil(ny, nm) * DAY_US
  return y * 12 + m - 1, stop - now, days_from_civil(nny, nnm) * DAY_US - stop
end

ALGO.fixed_window = function(key, p, now, cost, commit)
  local k, to_end, next_len = epoch_window(p, now)
  return fixed(key, p, cost, commit, k, to_end, next_len, count_at(key, p.limit, k))
end

ALGO.fixed_month = function(key, p, now, cost, commit)
  local k, to_end, next_len = month_window(now)
  return fixed(key, p, cost, commit, k, to_end, next_len, count_at(key, p.limit, k))
end

CHARGE.fixed_window = function(key, p, now, cost)
  local k, to_end, next_len = epoch_window(p, now)
  return fixed_charge(key, p, cost, k, to_end, next_len)
end

CHARGE.fixed_month = function(key, p, now, cost)
  local k, to_end, next_len = month_window(now)
  return fixed_charge(key, p, cost, k, to_end, next_len)
end
