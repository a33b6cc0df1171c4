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
-- A limit's static part (algorithm, N, W, C, I, unit) and a key's call (cost, shadow, op): the
-- 9 per key of a single request are the two in a row; a batch sends each distinct limit once.
local PER_SPEC = 6

-- ARGV repeats the same few values (costs, flags, ops): each distinct string is parsed once
-- per call.
local INTS = {}

-- ARGV[j] as an integer in lo..hi; raises (error table) otherwise.
local function arg(j, lo, hi, what)
  local s = ARGV[j]
  local v = INTS[s]
  if v == nil then
    v = int(s)
    if v ~= nil then INTS[s] = v end
  end
  if v == nil or v < lo or v > hi then
    error({err = 'sluice: bad ' .. what .. ' in ARGV[' .. j .. ']'})
  end
  return v
end

-- A limit's static parameters at ARGV[j .. j + 5], checked against `now`; raises on bad input.
local function spec_at(j, now)
  local algorithm = ARGV[j]
  if ALGO[algorithm] == nil then
    error({err = 'sluice: unknown algorithm in ARGV[' .. j .. ']'})
  end
  local s = {
    algorithm = algorithm,
    limit = arg(j + 1, 1, 10000000, 'limit'), -- Params::MAX_LIMIT in src/algo/mod.rs
    window = arg(j + 2, 1, MAX_EXACT - 1, 'window'),
    capacity = arg(j + 3, 1, MAX_EXACT - 1, 'capacity'),
    interval = arg(j + 4, 1, MAX_EXACT - 1, 'interval'),
    unit = arg(j + 5, 1, 1000, 'unit'),
  }
  local product = s.capacity * s.interval
  if algorithm == 'sliding_window' then product = s.limit * idiv(s.window, s.unit) end
  -- A bucket may owe one more capacity after a charge (CHARGE): twice C·I.
  if CHARGE[algorithm] ~= nil then product = 2 * product end
  if product >= MAX_EXACT or now + 2 * s.window >= MAX_EXACT then
    error({err = 'sluice: parameters past 2^53 in ARGV[' .. j .. ']'})
  end
  return s
end

-- One key's call: limit `s` with cost, shadow and op at ARGV[j .. j + 2].
local function call_at(s, j)
  -- The same limit with the same cost, flag and op is the same (read-only) call.
  local a, b, c = ARGV[j], ARGV[j + 1], ARGV[j + 2]
  local m = s.calls
  if m == nil then m = {}; s.calls = m end
  local key = (a or '') .. ':' .. (b or '') .. ':' .. (c or '')
  local hit = m[key]
  if hit ~= nil then return hit end
  hit = {
    algorithm = s.algorithm, limit = s.limit, window = s.window, capacity = s.capacity,
    interval = s.interval, unit = s.unit,
    cost = arg(j, 0, MAX_EXACT - 1, 'cost'),
    shadow = arg(j + 1, 0, 1, 'shadow flag') == 1,
    op = arg(j + 2, 0, 4, 'op'),
  }
  m[key] = hit
  return hit
end

-- One limit, as src/limiter/algo/mod.rs `run` does it.
local function one(now, key, i, p, write, nonce)
  local algo = ALGO[p.algorithm]
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

-- Every call of one request (its keys keys[k0 + 1 ..]), into `out` (5 integers per key);
-- whether all non-shadow limits admitted it.
local function run(now, keys, k0, calls, nonce, write, out)
  local pass = true
  for i, p in ipairs(calls) do
    local code, limit, remaining, retry, reset = one(now, keys[k0 + i], i, p, write, nonce)
    local o = 5 * (i - 1)
    out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5] =
      code, limit, remaining, retry, reset
    if code ~= 0 and not p.shadow then pass = false end
  end
  return pass
end

-- One request, its calls checked already: keys keys[k0 + 1 ..]. Returns its 5 integers per
-- key. Every key is touched before any is charged (several: by the dry run; one: by its
-- first access), so a key this node cannot serve (Redis Cluster, a slot that moved) raises
-- before the request has charged anything.
local function request(now, keys, k0, calls, nonce, commit)
  local out = {}
  if commit and #calls == 1 then
    -- Alone, committing directly is all-or-nothing already: a refusal writes nothing.
    run(now, keys, k0, calls, nonce, true, out)
  elseif run(now, keys, k0, calls, nonce, false, out) and commit then
    -- Deterministic: the same reads at the same `now` give the same decisions.
    run(now, keys, k0, calls, nonce, true, out)
  end
  return out
end

-- A single request: KEYS and ARGV as described at the top.
local function decide_all(now, extra_args)
  local nkeys = #KEYS
  if nkeys < 1 or #ARGV ~= 2 + PER_KEY * nkeys + extra_args then
    return redis.error_reply('sluice: expected 2 + 9 args per key')
  end
  local commit = arg(2, 0, 1, 'commit flag') == 1
  local calls = {}
  for i = 1, nkeys do
    local b = 2 + PER_KEY * (i - 1)
    calls[i] = call_at(spec_at(b + 1, now), b + 1 + PER_SPEC)
  end
  return request(now, KEYS, 0, calls, ARGV[1], commit)
end

-- One request of a batch: its n keys from KEYS[k0 + 1], its nonce at ARGV[a0], then 4 per key
-- (the index of its limit in `specs`, cost, shadow, op). Raises on bad input, before writing.
local function batch_request(now, keys, k0, n, a0, specs)
  local calls = {}
  for i = 1, n do
    local b = a0 + 4 * (i - 1)
    local s = specs[arg(b + 1, 1, #specs, 'limit index')]
    if s.bad ~= nil then error(s.bad) end
    calls[i] = call_at(s, b + 2)
  end
  return request(now, keys, k0, calls, ARGV[a0], true)
end

-- Several requests, decided one after another in the order given, each atomic and
-- all-or-nothing on its own: ARGV[1] = 'batch', ARGV[2] = R requests, ARGV[3] = L limits,
-- then each limit's 6 static values once (algorithm, N, W, C, I, unit), then per request its
-- key count, its nonce and 4 per key (limit index 1..L, cost, shadow, op); KEYS are the
-- requests' keys in order. With no KEYS the keys follow in ARGV instead: Redis Cluster routes
-- a call by its declared keys, which must share one slot, while a batch for one node spans
-- that node's slots (the script's `allow-cross-slot-keys` flag lets it touch them).
-- Reply: per request, its 5 integers per key, or the error string of that request alone (a
-- request that errs, or names a limit that does, or has a key this node does not serve,
-- wrote nothing; the others are unaffected).
local function decide_batch(now, extra_args)
  local count, nspecs = int(ARGV[2]), int(ARGV[3])
  if count == nil or count < 1 then return redis.error_reply('sluice: bad batch size') end
  if nspecs == nil or nspecs < 1 then return redis.error_reply('sluice: bad limit count') end
  local specs = {}
  for j = 1, nspecs do
    local ok, s = pcall(spec_at, 4 + PER_SPEC * (j - 1), now)
    if ok then specs[j] = s else specs[j] = {bad = s} end
  end
  local spans, a, k = {}, 3 + PER_SPEC * nspecs, 0
  for r = 1, count do
    local n = int(ARGV[a + 1])
    if n == nil or n < 1 then return redis.error_reply('sluice: bad key count in ARGV[' .. (a + 1) .. ']') end
    spans[r] = {k, n, a + 2}
    a, k = a + 2 + 4 * n, k + n
  end
  local keys = KEYS
  if #KEYS == 0 then
    keys = {}
    for i = 1, k do keys[i] = ARGV[a + i] end
    a = a + k
  end
  if k ~= #keys or a ~= #ARGV - extra_args then
    return redis.error_reply('sluice: batch does not match its KEYS and ARGV')
  end
  local out = {}
  for r, span in ipairs(spans) do
    local ok, res = pcall(batch_request, now, keys, span[1], span[2], span[3], specs)
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
