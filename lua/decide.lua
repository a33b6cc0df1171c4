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

-- Parses kept from one call to the next: a library of Redis Functions keeps its closures, and
-- so these tables (an EVAL script starts afresh each call). Each holds at most `cap` entries
-- and starts over when full, so memory stays bounded whatever the arguments.
local function cache(cap) return {t = {}, n = 0, cap = cap} end
local function remember(c, k, v)
  if c.n >= c.cap then c.t, c.n = {}, 0 end
  c.t[k], c.n = v, c.n + 1
end

-- ARGV repeats the same few values (limits' numbers, costs, flags), call after call: each
-- distinct string is parsed once.
local INTS = cache(256)

-- `s` (found at ARGV[j]) as an integer in lo..hi; raises (error table) otherwise.
local function num(s, j, lo, hi, what)
  local v = INTS.t[s]
  if v == nil then
    v = digits(s)
    if v ~= nil then remember(INTS, s, v) end
  end
  if v == nil or v < lo or v > hi then
    error({err = 'sluice: bad ' .. what .. ' in ARGV[' .. j .. ']'})
  end
  return v
end

-- ARGV[j] as an integer in lo..hi; raises (error table) otherwise.
local function arg(j, lo, hi, what)
  return num(ARGV[j], j, lo, hi, what)
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
  -- A bucket may owe one more capacity after a charge (CHARGE): twice C·I. (A sliding
  -- window's debt never forms a product past N·Wu: see sliding_window.lua.)
  if algorithm == 'token_bucket' or algorithm == 'leaky_bucket' or algorithm == 'gcra' then
    product = 2 * product
  end
  if product >= MAX_EXACT or now + 2 * s.window >= MAX_EXACT then
    error({err = 'sluice: parameters past 2^53 in ARGV[' .. j .. ']'})
  end
  return s
end

-- One key's call: limit `s` with cost, shadow flag and op, found at ARGV[j], ARGV[j + step]
-- and ARGV[j + 2 * step] (step 0: all three in one argument).
local function call_of(s, j, step, cost, shadow, op)
  return {
    algo = ALGO[s.algorithm], -- resolved once per call read, not per request
    algorithm = s.algorithm, limit = s.limit, window = s.window, capacity = s.capacity,
    interval = s.interval, unit = s.unit,
    cost = num(cost, j, 0, MAX_EXACT - 1, 'cost'),
    shadow = num(shadow, j + step, 0, 1, 'shadow flag') == 1,
    op = num(op, j + 2 * step, 0, 4, 'op'),
  }
end

-- One limit whose op is not a decision (`run` hands a decision, op 0, to its algorithm
-- itself): together, what src/limiter/algo/mod.rs `run` does.
local function one(now, key, i, p, write, nonce)
  local algo = p.algo
  if p.algorithm == 'concurrency' then return algo(key, p, now, p.cost, write, nonce, i) end
  -- A probe (1) charges nothing: whether its cost would pass, with what is there now (a cost-0
  -- look's remaining and reset). Release (3) and renew (4) concern concurrency leases alone.
  if p.op == 1 then
    local code, limit, _, retry = algo(key, p, now, p.cost, false, nonce, i)
    -- The look commits with the call: it charges nothing, but restates a state read under
    -- other parameters (RESTATES).
    local _, _, remaining, _, reset = algo(key, p, now, 0, write, nonce, i)
    return code, limit, remaining, retry, reset
  end
  if p.op ~= 2 then return algo(key, p, now, p.cost, false, nonce, i) end
  if not write or p.cost == 0 then return algo(key, p, now, 0, false, nonce, i) end
  return CHARGE[p.algorithm](key, p, now, p.cost, nonce, i)
end

-- Every call of one request (its keys keys[k0 + 1 ..]), into out[o0 + 1 ..] (5 integers per
-- key); whether all non-shadow limits admitted it.
local function run(now, keys, k0, calls, nonce, write, out, o0)
  local pass = true
  for i = 1, #calls do
    local p = calls[i]
    local code, limit, remaining, retry, reset
    if p.op == 0 then
      code, limit, remaining, retry, reset = p.algo(keys[k0 + i], p, now, p.cost, write, nonce, i)
    else
      code, limit, remaining, retry, reset = one(now, keys[k0 + i], i, p, write, nonce)
    end
    local o = o0 + 5 * (i - 1)
    out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5] =
      code, limit, remaining, retry, reset
    if code ~= 0 and not p.shadow then pass = false end
  end
  return pass
end

-- One request, its calls checked already: keys keys[k0 + 1 ..], its 5 integers per key into
-- out[o + 1 ..]. Every key is touched before any is charged (several: by the dry run; one:
-- by its first access), so a key this node cannot serve (Redis Cluster, a slot that moved)
-- raises before the request has charged anything.
local function request(now, keys, k0, calls, nonce, commit, out, o)
  if commit and #calls == 1 then
    -- Alone, committing directly is all-or-nothing already: a refusal charges nothing.
    run(now, keys, k0, calls, nonce, true, out, o)
  elseif run(now, keys, k0, calls, nonce, false, out, o) then
    -- Deterministic: the same reads at the same `now` give the same decisions.
    if commit then run(now, keys, k0, calls, nonce, true, out, o) end
  elseif commit then
    -- Refused: nothing is charged, but a state read under other parameters is written as
    -- read (a look of cost 0 that commits), or the waits just stated would not hold.
    for i = 1, #calls do
      local p = calls[i]
      if p.op <= 1 and RESTATES[p.algorithm] then p.algo(keys[k0 + i], p, now, 0, true, nonce, i) end
    end
  end
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
    local j = b + 1 + PER_SPEC
    calls[i] = call_of(spec_at(b + 1, now), j, 1, ARGV[j], ARGV[j + 1], ARGV[j + 2])
  end
  -- Sized for one key up front: growing a table five times costs more than the decision.
  local out = {0, 0, 0, 0, 0}
  request(now, KEYS, 0, calls, ARGV[1], commit, out, 0)
  return out
end

-- A request's shape in a batch: per key, its limit's index in `specs` (from 1), cost, shadow
-- flag and op, as `index:cost:shadow:op`, the keys' joined by `,` (one limit: `1:1:0:0`).
-- Requests of one route mostly share a shape, call after call, so each valid one is read once:
-- {n = its key count, calls...}, kept with the set of limits it was read against (see
-- limits_for), as its calls carry their limits' values. A shape that is not valid is {n, bad =
-- its error} (read again where it recurs, so that the error names the right ARGV); its key
-- count is still known, so the requests after it are found.
--
-- Per set of limits (a call's limits' values, joined): {specs = the limits parsed, shapes =
-- the shapes read against them, window = their longest window}.
local SETS = cache(64)
-- This call's shapes (see limits_for).
local SHAPES

-- One key's part of the shape at ARGV[j] as its call; raises on bad input.
local function shape_call(part, j, specs)
  local i, cost, shadow, op = string.match(part, '^(%d+):(%d+):(%d+):(%d+)$')
  if i == nil then error({err = 'sluice: bad request shape in ARGV[' .. j .. ']'}) end
  local spec = specs[num(i, j, 1, #specs, 'limit index')]
  if spec.bad ~= nil then error(spec.bad) end
  return call_of(spec, j, 0, cost, shadow, op)
end

local function shape_at(j, specs)
  local s = ARGV[j]
  local shape = SHAPES.t[s]
  if shape ~= nil then return shape end
  shape = {n = 0}
  for part in string.gmatch(s .. ',', '([^,]*),') do
    shape.n = shape.n + 1
    local ok, call = pcall(shape_call, part, j, specs)
    if ok then shape[shape.n] = call elseif shape.bad == nil then shape.bad = call end
  end
  if shape.bad == nil then remember(SHAPES, s, shape) end
  return shape
end

-- The call's limits (ARGV[4 ..], `nspecs` of them), each parsed or {bad = its error}, and the
-- shapes kept for them. Calls on the same limits reuse both while every limit stays valid at
-- the call's `now` (its window must end before 2^53): a lone request's call then parses none
-- of them. A call in which a limit is bad parses them afresh and keeps nothing, so a limit
-- valid only until `now` nears 2^53 never lends such a call the shapes read while it was.
local function limits_for(nspecs, now)
  local last = 3 + PER_SPEC * nspecs
  local set = last <= #ARGV and table.concat(ARGV, ' ', 4, last)
  local kept = set and SETS.t[set]
  if kept and now + 2 * kept.window < MAX_EXACT then return kept.specs, kept.shapes end
  local specs, window, bad = {}, 0, not set
  for j = 1, nspecs do
    local ok, s = pcall(spec_at, 4 + PER_SPEC * (j - 1), now)
    if ok then
      specs[j], window = s, max(window, s.window)
    else
      specs[j], bad = {bad = s}, true
    end
  end
  if bad then return specs, cache(64) end
  kept = {specs = specs, shapes = cache(64), window = window}
  remember(SETS, set, kept)
  return specs, kept.shapes
end

-- Several requests, decided one after another in the order given, each atomic and
-- all-or-nothing on its own: ARGV[1] = 'batch', ARGV[2] = R requests, ARGV[3] = L limits,
-- then each limit's 6 static values once (algorithm, N, W, C, I, unit), then per request its
-- nonce and its shape (above); KEYS are the requests' keys in order. With no KEYS the keys
-- follow in ARGV instead: Redis Cluster routes a call by its declared keys, which must share
-- one slot, while a batch for one node spans that node's slots (the script's
-- `allow-cross-slot-keys` flag lets it touch them).
-- Reply: one flat array, per request in order its 5 integers per key, or in their place one
-- string, the error of that request alone (a request that errs, or names a limit that does,
-- or has a key this node does not serve, wrote nothing; the others are unaffected). Flat,
-- because Redis pays for every nested array of a reply more than for its five integers.
local function decide_batch(now, extra_args)
  local count, nspecs = digits(ARGV[2]), digits(ARGV[3])
  if count == nil or count < 1 then return redis.error_reply('sluice: bad batch size') end
  if nspecs == nil or nspecs < 1 then return redis.error_reply('sluice: bad limit count') end
  local specs
  specs, SHAPES = limits_for(nspecs, now)
  local first = 4 + PER_SPEC * nspecs -- the first request's nonce
  local mismatch = 'sluice: batch does not match its KEYS and ARGV'
  if first - 1 + 2 * count > #ARGV - extra_args then return redis.error_reply(mismatch) end
  local a, k = first, 0
  for r = 1, count do
    a, k = a + 2, k + shape_at(a + 1, specs).n
  end
  local keys = KEYS
  if #KEYS == 0 then
    keys = {}
    for i = 1, k do keys[i] = ARGV[a - 1 + i] end
    a = a + k
  end
  if k ~= #keys or a - 1 ~= #ARGV - extra_args then return redis.error_reply(mismatch) end
  local out, o, k0 = {}, 0, 0
  for r = 1, count do
    local at = first + 2 * (r - 1)
    local shape = shape_at(at + 1, specs)
    local err = shape.bad
    if err == nil then
      local ok, e = pcall(request, now, keys, k0, shape, ARGV[at], true, out, o)
      if ok then o = o + 5 * shape.n else err = e end
    end
    if err ~= nil then
      -- The error alone in the request's place: what its dry run wrote goes.
      for i = o + 2, o + 5 * shape.n do out[i] = nil end
      if type(err) == 'table' then err = err.err or 'sluice: error' end
      out[o + 1] = tostring(err)
      o = o + 1
    end
    k0 = k0 + shape.n
  end
  return out
end

-- The tests' pinned entry and production's (below) both dispatch here: `keys` and `argv` as
-- described at the top, `now` in µs.
local function decide(now, extra_args, keys, argv)
  KEYS, ARGV = keys, argv
  if ARGV[1] == 'batch' then return decide_batch(now, extra_args) end
  return decide_all(now, extra_args)
end

-- Production's entry: decide at the store's own clock, so gateways with skewed clocks agree.
local function decide_now(keys, argv)
  local t = redis.call('TIME')
  return decide(tonumber(t[1]) * 1000000 + tonumber(t[2]), 0, keys, argv)
end
