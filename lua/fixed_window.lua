-- fixed_window: window k = floor(now / W), epoch-aligned; admit iff count + cost <= N.
-- State: hash {w = window index, n = count}. Twin of src/algo/fixed_window.rs.
ALGO.fixed_window = function(key, p, now, cost, commit)
  local n, w = p.limit, p.window
  local k = idiv(now, w)
  local to_end = (k + 1) * w - now
  local s = redis.call('HMGET', key, 'w', 'n')
  local sw, sc = int(s[1]), int(s[2])
  local count = 0
  -- Any other window (older, or future after a clock step back) counts nothing.
  if sw ~= nil and sc ~= nil and sw == k then count = sc end
  local remaining = math.max(n - count, 0)
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
