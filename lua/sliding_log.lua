-- sliding_log: a sorted set of admitted units, score = admission µs, members unique across
-- gateways (`now:nonce:limit:unit`). Entries <= now - W are gone; admit iff live + cost <= N.
-- Exact: at most N in every half-open (t - W, t]. Twin of src/algo/sliding_log.rs.
-- Drop the entries gone at now (all of them for a log from the future), add `count` of now,
-- unique across gateways, and keep the key W more.
local function log_add(key, now, horizon, future, count, nonce, index, w)
  if future then
    redis.call('DEL', key)
  else
    redis.call('ZREMRANGEBYSCORE', key, '-inf', horizon)
  end
  local at = fmt(now)
  local member = at .. ':' .. nonce .. ':' .. fmt(index) .. ':'
  local batch = {}
  for i = 1, count do
    batch[#batch + 1] = at
    batch[#batch + 1] = member .. fmt(i)
    if #batch >= 1000 or i == count then
      redis.call('ZADD', key, unpack(batch))
      batch = {}
    end
  end
  expire_us(key, w)
end

-- The log at now: its horizon (entries at or before it are gone), newest entry, whether it
-- is from the future (corruption, or the clock stepped back: it then reads as fresh), and
-- how many entries are live.
local function log_at(key, now, w)
  local horizon = fmt(now - w)
  local top = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  local newest = top[2] and tonumber(top[2])
  local future = newest ~= nil and newest > now
  local live = 0
  if newest ~= nil and not future then
    live = redis.call('ZCOUNT', key, '(' .. horizon, '+inf')
  end
  return horizon, newest, future, live
end

ALGO.sliding_log = function(key, p, now, cost, commit, nonce, index)
  local n, w = p.limit, p.window
  local horizon, newest, future, live = log_at(key, now, w)
  local reset = 0
  if live > 0 then reset = newest + w - now end
  local remaining = max(n - live, 0)
  if cost > n then return 2, n, remaining, 0, reset end
  if cost == 0 then return 0, n, remaining, 0, reset end
  if cost > remaining then
    -- The (live + cost - N)-th oldest live entry must age out first.
    local e = redis.call('ZRANGEBYSCORE', key, '(' .. horizon, '+inf', 'WITHSCORES',
      'LIMIT', fmt(live + cost - n - 1), '1')
    return 1, n, remaining, tonumber(e[2]) + w - now, reset
  end
  if commit then log_add(key, now, horizon, future, cost, nonce, index, w) end
  return 0, n, remaining - cost, 0, w
end

-- Charge even past N (after the answer): entries of now up to 2N live, which later requests
-- wait out as they age.
CHARGE.sliding_log = function(key, p, now, cost, nonce, index)
  local _, n, left, _, reset = ALGO.sliding_log(key, p, now, 0, false, nonce, index)
  if cost <= left then return ALGO.sliding_log(key, p, now, cost, true, nonce, index) end
  local w = p.window
  local horizon, _, future, live = log_at(key, now, w)
  local add = min(cost, 2 * n - live)
  if add > 0 then
    log_add(key, now, horizon, future, add, nonce, index, w)
    reset = w
  end
  return 0, n, 0, 0, reset
end
