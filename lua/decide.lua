-- All limits of one request in one atomic call, all-or-nothing.
--
-- KEYS: one key per limit (distinct). ARGV: [1] nonce (unique per call across gateways, for
-- sliding_log members and concurrency leases), [2] commit (0 = peek, 1 = decide), then 9 per
-- key: algorithm name, N, W µs, C, I µs, unit µs, cost, shadow (0|1), op.
-- Reply: 5 integers per key, {code, limit, remaining, retry_after_us, reset_after_us}.
--
-- op (src/limiter/algo/mod.rs `Op`): 0 decide, 1 probe (would `cost` pass? never writes),
-- 2 charge (after the answer: charged even past the limit, always passes), 3 release and
-- 4 renew (a concurrency lease named by the nonce).
--
-- The request passes iff every non-shadow limit admits it; only then is anything charged
-- (each limit that admitted; a refusing shadow limit writes nothing). Every ARGV is checked
-- before the first write, so bad input is an error reply that changed nothing.
local PER_KEY = 9

local function decide_all(now, extra_args)
  local nkeys = #KEYS
  if nkeys < 1 or #ARGV ~= 2 + PER_KEY * nkeys + extra_args then
    return redis.error_reply('sluice: expected 2 + 9 args per key')
  end
  local function arg(j, lo, hi, what)
    local v = int(ARGV[j])
    if v == nil or v < lo or v > hi then
      error({err = 'sluice: bad ' .. what .. ' in ARGV[' .. j .. ']'})
    end
    return v
  end
  local nonce = ARGV[1]
  local commit = arg(2, 0, 1, 'commit flag') == 1
  local calls = {}
  for i = 1, nkeys do
    local b = 2 + PER_KEY * (i - 1)
    local p = {}
    p.algorithm = ARGV[b + 1]
    if ALGO[p.algorithm] == nil then
      error({err = 'sluice: unknown algorithm in ARGV[' .. (b + 1) .. ']'})
    end
    p.limit = arg(b + 2, 1, 10000000, 'limit') -- Params::MAX_LIMIT in src/algo/mod.rs
    p.window = arg(b + 3, 1, MAX_EXACT - 1, 'window')
    p.capacity = arg(b + 4, 1, MAX_EXACT - 1, 'capacity')
    p.interval = arg(b + 5, 1, MAX_EXACT - 1, 'interval')
    p.unit = arg(b + 6, 1, 1000, 'unit')
    p.cost = arg(b + 7, 0, MAX_EXACT - 1, 'cost')
    p.shadow = arg(b + 8, 0, 1, 'shadow flag') == 1
    p.op = arg(b + 9, 0, 4, 'op')
    local product = p.capacity * p.interval
    if p.algorithm == 'sliding_window' then product = p.limit * idiv(p.window, p.unit) end
    -- A bucket may owe one more capacity after a charge (CHARGE): twice C·I.
    if CHARGE[p.algorithm] ~= nil then product = 2 * product end
    if product >= MAX_EXACT or now + 2 * p.window >= MAX_EXACT then
      error({err = 'sluice: parameters past 2^53 in ARGV[' .. (b + 1) .. ']'})
    end
    calls[i] = p
  end

  -- One limit, as src/limiter/algo/mod.rs `run` does it.
  local function one(i, p, write)
    local algo = ALGO[p.algorithm]
    if p.algorithm == 'concurrency' then return algo(KEYS[i], p, now, p.cost, write, nonce, i) end
    if p.op ~= 2 then return algo(KEYS[i], p, now, p.cost, write and p.op == 0, nonce, i) end
    if not write or p.cost == 0 then return algo(KEYS[i], p, now, 0, false, nonce, i) end
    if CHARGE[p.algorithm] ~= nil then return CHARGE[p.algorithm](KEYS[i], p, now, p.cost) end
    -- A window charges what still fits in it.
    local _, _, left = algo(KEYS[i], p, now, 0, false, nonce, i)
    local _, limit, remaining, retry, reset =
      algo(KEYS[i], p, now, math.min(p.cost, left), true, nonce, i)
    return 0, limit, remaining, retry, reset
  end

  local out = {}
  local function run(write)
    local pass = true
    for i, p in ipairs(calls) do
      local code, limit, remaining, retry, reset = one(i, p, write)
      local o = 5 * (i - 1)
      out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5] =
        code, limit, remaining, retry, reset
      if code ~= 0 and not p.shadow then pass = false end
    end
    return pass
  end
  if commit and nkeys == 1 then
    -- Alone, committing directly is all-or-nothing already: a refusal writes nothing.
    run(true)
  elseif run(false) and commit then
    -- Deterministic: the same reads at the same `now` give the same decisions.
    run(true)
  end
  return out
end
