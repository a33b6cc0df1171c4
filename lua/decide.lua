-- All limits of one request in one atomic call, all-or-nothing (or several requests, each so,
-- in one call: see decide_batch at the end).
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

-- One request: keys KEYS[k0 + 1 .. k0 + nkeys]; ARGV[a0 + 1] nonce, ARGV[a0 + 2] commit, then
-- 9 per key. Returns its 5 integers per key; raises (error table) on bad input, before writing.
local function request(now, k0, nkeys, a0)
  local function arg(j, lo, hi, what)
    local v = int(ARGV[j])
    if v == nil or v < lo or v > hi then
      error({err = 'sluice: bad ' .. what .. ' in ARGV[' .. j .. ']'})
    end
    return v
  end
  local nonce = ARGV[a0 + 1]
  local commit = arg(a0 + 2, 0, 1, 'commit flag') == 1
  local calls = {}
  for i = 1, nkeys do
    local b = a0 + 2 + PER_KEY * (i - 1)
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
    local algo, key = ALGO[p.algorithm], KEYS[k0 + i]
    if p.algorithm == 'concurrency' then return algo(key, p, now, p.cost, write, nonce, i) end
    if p.op ~= 2 then return algo(key, p, now, p.cost, write and p.op == 0, nonce, i) end
    if not write or p.cost == 0 then return algo(key, p, now, 0, false, nonce, i) end
    if CHARGE[p.algorithm] ~= nil then return CHARGE[p.algorithm](key, p, now, p.cost) end
    -- A window charges what still fits in it.
    local _, _, left = algo(key, p, now, 0, false, nonce, i)
    local _, limit, remaining, retry, reset =
      algo(key, p, now, math.min(p.cost, left), true, nonce, i)
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

-- A single request: KEYS and ARGV as described at the top.
local function decide_all(now, extra_args)
  local nkeys = #KEYS
  if nkeys < 1 or #ARGV ~= 2 + PER_KEY * nkeys + extra_args then
    return redis.error_reply('sluice: expected 2 + 9 args per key')
  end
  return request(now, 0, nkeys, 0)
end

-- Several requests, decided one after another in the order given, each atomic and
-- all-or-nothing on its own: ARGV[1] = 'batch', ARGV[2] = R, then per request its key count
-- followed by its own nonce, commit and 9 per key; KEYS are the requests' keys in order.
-- Reply: per request, its 5 integers per key, or the error string of that request alone (a
-- request that errs wrote nothing; the others are unaffected).
local function decide_batch(now, extra_args)
  local count = int(ARGV[2])
  if count == nil or count < 1 then return redis.error_reply('sluice: bad batch size') end
  local spans, a, k = {}, 2, 0
  for r = 1, count do
    local n = int(ARGV[a + 1])
    if n == nil or n < 1 then return redis.error_reply('sluice: bad key count in ARGV[' .. (a + 1) .. ']') end
    spans[r] = {k, n, a + 1}
    a, k = a + 3 + PER_KEY * n, k + n
  end
  if k ~= #KEYS or a ~= #ARGV - extra_args then
    return redis.error_reply('sluice: batch does not match its KEYS and ARGV')
  end
  local out = {}
  for r, span in ipairs(spans) do
    local ok, res = pcall(request, now, span[1], span[2], span[3])
    if ok then
      out[r] = res
    elseif type(res) == 'table' then
      out[r] = res.err or 'sluice: error'
    else
      out[r] = tostring(res)
    end
  end
  return out
end

-- The production entry and the tests' pinned one both dispatch here.
local function decide(now, extra_args)
  if ARGV[1] == 'batch' then return decide_batch(now, extra_args) end
  return decide_all(now, extra_args)
end
