-- concurrency: at most N requests of a key in flight. State: a sorted set of lease
-- ids (the request's call nonce), scored by expiry µs (now + W, W = `lease`); a lease whose
-- gateway died expires by itself. p.op: 0 take a slot, 1 look only, 3 release, 4 renew.
-- A refusal's retry is a fixed 1 s. Twin of src/limiter/algo/concurrency.rs.
ALGO.concurrency = function(key, p, now, cost, commit, nonce)
  local n, at = p.limit, fmt(now)
  if commit and p.op == 3 then
    redis.call('ZREM', key, nonce)
    redis.call('ZREMRANGEBYSCORE', key, '-inf', at)
  elseif commit and p.op == 4 then
    local s = tonumber(redis.call('ZSCORE', key, nonce))
    -- An expired lease is not taken back: its slot may have gone to another request.
    if s ~= nil and s > now then redis.call('ZADD', key, 'XX', fmt(now + p.window), nonce) end
  end
  local live = redis.call('ZCOUNT', key, '(' .. at, '+inf')
  local free = max(n - live, 0)
  if p.op == 3 or p.op == 4 then
    if commit then
      local top = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
      if top[2] ~= nil and tonumber(top[2]) > now then
        expire_us(key, tonumber(top[2]) - now)
      else
        redis.call('DEL', key)
      end
    end
    return 0, n, free, 0, 0
  end
  if cost == 0 then return 0, n, free, 0, 0 end
  if cost > free then return 1, n, free, 1000000, 0 end
  if commit and p.op == 0 then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', at)
    redis.call('ZADD', key, fmt(now + p.window), nonce)
    expire_us(key, p.window)
  end
  return 0, n, free - 1, 0, 0
end
