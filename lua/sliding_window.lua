-- sliding_window (Cloudflare's counter): counts of the current and previous epoch-aligned
-- windows, the previous one weighing what is left of it, in units of u µs (1, or 1000 when
-- N·W would pass 2^53): with Wu = W / u, eu = floor(e / u), admit iff
-- prev·(Wu − eu) + (cur + cost)·Wu <= N·Wu. Only admitted units count.
-- State: hash {w = window index, c = current count, p = previous count}.
-- Twin of src/algo/sliding_window.rs (its doc derives retry and reset).
-- Until the window is empty, for `c` units in the current one: functions of the file, not
-- closures per decision (Redis would allocate each one each time).
local function window_reset(c, prev, w, e, zero)
  if c > 0 then return w - e + zero end
  if prev > 0 and e < zero then return zero - e end
  return 0
end

-- Elapsed units (× u) from which a count `by` weighs no more than `r`: Wu − floor(r·Wu / by).
local function weighs_at_most(r, by, wu, u) return (wu - idiv(r * wu, by)) * u end

-- The counts at now: window index k, elapsed e, current and previous counts (a state of
-- window k - 1 becomes prev; an older one, or a future one, counts nothing).
local function window_counts(key, w, now)
  local k = idiv(now, w)
  local e = now - k * w
  local s = redis.call('HMGET', key, 'w', 'c', 'p')
  local sw, sc, sp = int(s[1]), int(s[2]), int(s[3])
  local cur, prev = 0, 0
  if sw ~= nil and sc ~= nil and sp ~= nil then
    if sw == k then
      cur, prev = sc, sp
    elseif sw == k - 1 then
      prev = sc
    end
  end
  return k, e, cur, prev
end

ALGO.sliding_window = function(key, p, now, cost, commit)
  local n, w, u = p.limit, p.window, p.unit
  local k, e, cur, prev = window_counts(key, w, now)
  local wu, eu = idiv(w, u), idiv(e, u)
  local zero = wu * u
  -- room = floor((N·Wu − prev·(Wu − eu)) / Wu), at least 0. A charge's debt lets prev reach
  -- 2N, whose product with Wu could pass 2^53: it is formed only when below N·Wu.
  local room = 0
  local left = wu - eu
  if prev == 0 or left <= idiv(n * wu - 1, prev) then
    room = idiv(n * wu - prev * left, wu)
  end
  local remaining = max(room - cur, 0)
  if cost > n then return 2, n, remaining, 0, window_reset(cur, prev, w, e, zero) end
  if cost == 0 then return 0, n, remaining, 0, window_reset(cur, prev, w, e, zero) end
  if cost > remaining then
    local retry
    if cur + cost <= n then
      retry = weighs_at_most(n - cur - cost, prev, wu, u) - e
    else
      retry = w - e + weighs_at_most(n - cost, cur, wu, u)
    end
    return 1, n, remaining, retry, window_reset(cur, prev, w, e, zero)
  end
  if commit then
    redis.call('HSET', key, 'w', fmt(k), 'c', fmt(cur + cost), 'p', fmt(prev))
    expire_us(key, 2 * w - e)
  end
  return 0, n, remaining - cost, 0, window_reset(cur + cost, prev, w, e, zero)
end

-- Charge even past N (after the answer): the current count up to 2N, whose excess weighs on
-- the next window as prev.
CHARGE.sliding_window = function(key, p, now, cost)
  local _, _, left = ALGO.sliding_window(key, p, now, 0, false)
  if cost <= left then return ALGO.sliding_window(key, p, now, cost, true) end
  local n, w = p.limit, p.window
  local k, e, cur, prev = window_counts(key, w, now)
  redis.call('HSET', key, 'w', fmt(k), 'c', fmt(min(cur + cost, 2 * n)), 'p', fmt(prev))
  expire_us(key, 2 * w - e)
  local _, _, _, _, reset = ALGO.sliding_window(key, p, now, 0, false)
  return 0, n, 0, 0, reset
end
