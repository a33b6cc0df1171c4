-- sliding_window (Cloudflare's counter): counts of the current and previous epoch-aligned
-- windows, the previous one weighing what is left of it, in units of u µs (1, or 1000 when
-- N·W would pass 2^53): with Wu = W / u, eu = floor(e / u), admit iff
-- prev·(Wu − eu) + (cur + cost)·Wu <= N·Wu. Only admitted units count.
-- State: hash {w = window index, c = current count, p = previous count}.
-- Twin of src/algo/sliding_window.rs (its doc derives retry and reset).
ALGO.sliding_window = function(key, p, now, cost, commit)
  local n, w, u = p.limit, p.window, p.unit
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
  local wu, eu = idiv(w, u), idiv(e, u)
  local zero = wu * u
  local room = n * wu - prev * (wu - eu)
  if room < 0 then room = 0 else room = idiv(room, wu) end
  local remaining = math.max(room - cur, 0)
  local function reset(c)
    if c > 0 then return w - e + zero end
    if prev > 0 and e < zero then return zero - e end
    return 0
  end
  if cost > n then return 2, n, remaining, 0, reset(cur) end
  if cost == 0 then return 0, n, remaining, 0, reset(cur) end
  if cost > remaining then
    -- Elapsed time from which a count `by` weighs no more than `r`: Wu − floor(r·Wu / by).
    local function from(r, by) return (wu - idiv(r * wu, by)) * u end
    local retry
    if cur + cost <= n then
      retry = from(n - cur - cost, prev) - e
    else
      retry = w - e + from(n - cost, cur)
    end
    return 1, n, remaining, retry, reset(cur)
  end
  if commit then
    redis.call('HSET', key, 'w', fmt(k), 'c', fmt(cur + cost), 'p', fmt(prev))
    expire_us(key, 2 * w - e)
  end
  return 0, n, remaining - cost, 0, reset(cur + cost)
end
