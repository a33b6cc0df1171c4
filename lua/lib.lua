-- Shared helpers of the limiter scripts. Everything is an integer number of microseconds
-- held exactly in a double (< 2^53); nothing is stored or returned as a float.

local MAX_EXACT = 9007199254740992 -- 2^53

-- The call's keys and arguments (decide() sets them): locals, not Redis's globals, because a
-- library of Redis Functions is handed them as arguments and may not read or set globals.
local KEYS, ARGV

-- Lua 5.1 looks a global up by name on every use; these run several times per request.
local tonumber, sformat, floor, max, min = tonumber, string.format, math.floor, math.max, math.min

-- Stored state as a number, or nil when absent, negative, fractional or >= 2^53: corrupt or
-- foreign state then reads as a fresh key (never as more than a full quota). Any other
-- spelling of an integer in range (`1e3`, ` 7`) reads as that integer, a state the algorithms
-- handle like any other; checking the digits too cost more than the rest of a decision.
local function int(s)
  local v = tonumber(s)
  if v == nil or v < 0 or v >= MAX_EXACT or v % 1 ~= 0 then return nil end
  return v
end

-- An argument as a number: plain decimal digits only, below 2^53; nil otherwise.
local function digits(s)
  if type(s) ~= 'string' or #s > 16 or not string.match(s, '^%d+$') then
    return nil
  end
  return int(s)
end

-- Integers print in full (`tostring` would print 1.7953151949079e+15).
local function fmt(v)
  return sformat('%d', v)
end

-- floor(a / b) for integers 0 <= a < 2^53, b >= 1, exact: the double quotient can round
-- up to the next integer, so correct it with exact products.
local function idiv(a, b)
  local q = floor(a / b)
  while q * b > a do q = q - 1 end
  while (q + 1) * b <= a do q = q + 1 end
  return q
end

-- Time owed, written at interval `was`, read at interval `i` (gcra's TAT, token_bucket's debt):
-- ceil(debt · i / was), exact (the product passes 2^53), or anything above bound if that
-- is: the units owed at interval `was`, to the µs at interval `i`. Whole units first; the part
-- unit r < was by long division over the bits of i, so no value passes 3·was.
local function rescale(debt, was, i, bound)
  local q = idiv(debt, was)
  if q * i > bound then return bound + 1 end
  local r = debt - q * was
  local bits, n = {}, i
  while n > 0 do
    bits[#bits + 1] = n % 2
    n = (n - n % 2) / 2
  end
  local aq, ar = 0, 0 -- aq·was + ar = r · (the bits of i read so far), ar < was
  for k = #bits, 1, -1 do
    aq, ar = 2 * aq, 2 * ar
    if ar >= was then aq, ar = aq + 1, ar - was end
    if bits[k] == 1 then
      ar = ar + r
      if ar >= was then aq, ar = aq + 1, ar - was end
    end
  end
  if ar > 0 then aq = aq + 1 end
  return q * i + aq
end

-- TTL in the same script as the write, rounded up to whole ms, never 0.
local function expire_us(key, ttl_us)
  local ms = idiv(ttl_us + 999, 1000)
  if ms < 1 then ms = 1 end
  redis.call('PEXPIRE', key, fmt(ms))
end

-- ALGO[name](key, p, now, cost, commit, nonce, index) -> code, limit, remaining, retry_us,
-- reset_us. p = {limit = N, window = W, capacity = C, interval = I, unit = u}. With commit, an
-- admitted request writes its new state; a limited (1) one charges nothing (an algorithm of
-- RESTATES may write its state again as read), an impossible (2) one never writes.
-- nonce (unique per call) and index (the limit's position) only name sliding_log members.
local ALGO = {}
-- Algorithms whose state, read under other parameters than it was written with (a reload, a
-- plan change), is written again as read by a committing call that charges nothing (cost 0,
-- or a refusal): gcra's time owed at a new interval, token_bucket's debt held to a lowered
-- burst. Twin of `Algorithm::restates`.
local RESTATES = {gcra = true, token_bucket = true}
-- CHARGE[name](key, p, now, cost, nonce, index) -> the same five values: the charge after the
-- answer, even past the limit, into at most one capacity of debt that later requests wait out.
local CHARGE = {}
